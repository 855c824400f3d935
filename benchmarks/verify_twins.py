"""What ``export-llm --verify`` decides for a right ``.pte`` and for its broken twins, at every precision.

    python benchmarks/verify_twins.py > benchmarks/results/verify_twins.txt                 # a few minutes
    python benchmarks/verify_twins.py --families > benchmarks/results/verify_families.txt   # every family: longer

Each row lowers a model once (``text_generation.lower_decoder``, host form) and runs its
``.pte`` over ``export-llm --verify``'s tokens (a seeded 8-token prompt in
one call, the fp32 model's 8 greedy tokens one a call:
``text_generation.check.reference``).  ``text_generation.check.judge`` then compares those logits
with the eager model the ``.pte`` was lowered from (the model at its dtype,
or the quantized eager model ``lower_decoder(quantized_reference=)`` hands
back), and with each broken twin of that eager model
(``tests/llm_helpers.py``, ``broken_twin``: what a wrong conversion could
compute instead; and every SiLU converted as GELU, a subtler twin the tests
do not hold the check to).  The row prints the SNR (dB) of the centered logits
against each, the least SNR the runtime's arithmetic allows
(``fidelity.runtime_threshold``: unit roundoff, the model's widest
reduction and its depth, less 10 dB), and whether the check passes.  A right
``.pte`` must pass and every twin fail.

``--families`` instead lowers every family's tiny model of the tests
(``llm_helpers.tiny``: random, norm weights randomized) at fp32 and at
fp16 and prints how far each right ``.pte`` is above the least SNR: what
the network's gain leaves of the 10 dB ``GAIN_DB`` allows for it.

Models: the tiny Llama of the tests (d 64, MLP 128, 2 layers, vocab 256)
at fp32, fp16 and fp16 with ``palettize4``; the wider Llama of
``tests/test_quantized_schemes.py`` (d 256, MLP 1024, 2 layers, vocab 1024)
under every ``--quantize`` scheme on fp32.  ``tests/test_fidelity.py`` and
``tests/test_quantized_schemes.py`` assert the same verdicts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore")
sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests")]

from llm_helpers import ROWS, TWINS, broken_twin, tiny  # noqa: E402

from coreai_partitioner import console, text_generation, save_pte, verify  # noqa: E402
from coreai_partitioner.quantize import SCHEMES  # noqa: E402
from coreai_partitioner.verify import fidelity  # noqa: E402
from coreai_partitioner.verify.table import table  # noqa: E402

TINY = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=16)
WIDER = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=8)


def wider() -> torch.nn.Module:
    """tests/test_quantized_schemes.py's model: the tiny Llama config, d 256, MLP 1024, vocab 1024, seeded."""
    import transformers

    config = text_generation.tiny_config("llama")
    config.hidden_size, config.intermediate_size, config.vocab_size = 256, 1024, 1024
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def row(name: str, make, dtype: torch.dtype, scheme: str | None, shapes: text_generation.DecoderShapes, directory: Path) -> list:
    reference = text_generation.check.reference(make(), shapes)
    model = make().to(dtype)
    held: list = []
    start = time.perf_counter()
    pte = save_pte(text_generation.lower_decoder(model, shapes, quantize=scheme, quantized_reference=held), directory / "model.pte")
    eager_model = held[0] if held else model
    logits = text_generation.check.program_logits(pte, reference, shapes)
    verify.reset_state(pte)
    cells = []
    for twin in ("right", *TWINS, "SiLU converted as GELU"):
        candidate = eager_model if twin == "right" else broken_twin(eager_model, twin)
        eager = text_generation.check.eager_logits(candidate, reference, shapes)
        report = text_generation.check.judge(logits, reference, eager=eager, dtype=dtype, quantize=scheme)
        signal = report.signal.outputs[0]
        cells.append(f"{signal.snr:.1f} ({'passes' if report.ok else 'fails'})")
    threshold = report.signal.outputs[0].threshold.snr
    quality = report.quality
    print(f"  {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return [name, f"{threshold:.1f}", *cells, f"{quality.snr:.1f}"]


def family_row(model_type: str, dtype: torch.dtype, directory: Path) -> list:
    reference = text_generation.check.reference(tiny(model_type), TINY)
    model = tiny(model_type, dtype)
    eager = None if dtype == torch.float32 else text_generation.check.eager_logits(model, reference, TINY)
    pte = save_pte(text_generation.lower_decoder(model, TINY), directory / "model.pte")
    report = text_generation.check.check(pte, reference, TINY, eager=eager, dtype=dtype)
    verify.reset_state(pte)
    signal = report.signal.outputs[0]
    bound = signal.threshold.snr + fidelity.GAIN_DB
    name = fidelity.precision_name(dtype)
    print(f"  {model_type} {name}: {signal.snr:.1f} dB", file=sys.stderr, flush=True)
    return [model_type, name, reference.width, reference.depth, f"{bound:.1f}", f"{signal.threshold.snr:.1f}",
            f"{signal.snr:.1f}", f"{signal.snr - bound:+.1f}", "passes" if report.ok else "FAILS"]


def families(directory: Path) -> None:
    found = [family_row(t, dtype, directory) for t in ROWS for dtype in (torch.float32, torch.float16)]
    print("Each family's tiny model: SNR (dB) of its .pte's centered logits against its eager model at the .pte's dtype,")
    print("beside the rounding bound u * sqrt(K) * sqrt(depth) in dB and the least SNR (the bound less GAIN_DB)\n")
    headers = ["family", "dtype", "widest K", "depth", "bound", "least SNR", "SNR", "SNR - bound", "--verify"]
    print(table(found, headers))


def twins(directory: Path) -> None:
    rows = [
        ("tiny Llama, fp32", lambda: tiny("llama"), torch.float32, None, TINY),
        ("tiny Llama, fp16", lambda: tiny("llama"), torch.float16, None, TINY),
        ("tiny Llama, fp16 + palettize4", lambda: tiny("llama"), torch.float16, "palettize4", TINY),
        *((f"wider Llama, fp32 + {scheme}", wider, torch.float32, scheme, WIDER) for scheme in SCHEMES),
    ]
    found = [row(name, make, dtype, scheme, shapes, directory) for name, make, dtype, scheme, shapes in rows]
    headers = ["row", "least SNR", "the model", *TWINS, "SiLU converted as GELU", "against fp32 (report)"]
    print("SNR (dB) of the .pte's centered logits against each eager model; --verify passes at the least SNR or above\n")
    print(table(found, headers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", action="store_true", help="every family's tiny model, right .pte only")
    args = parser.parse_args()
    console.quiet_dependencies(False)
    with tempfile.TemporaryDirectory() as directory, console.NativeStreams():
        (families if args.families else twins)(Path(directory))


if __name__ == "__main__":
    main()
