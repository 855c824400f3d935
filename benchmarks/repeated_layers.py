"""Layers traced once and repeated (coreai_partitioner.lowering.repeated), family by family: the same .pte or not.

    python benchmarks/repeated_layers.py                       # every family, host, device and int4; writes the results
    python benchmarks/repeated_layers.py --forms host --families qwen3 llama
    python benchmarks/repeated_layers.py --layer-types cyclic  # the tiny config's layer types repeated, not its first

Each family of ``tests/llm_helpers.ROWS`` at its tiny config with 6 layers,
every per-layer list of its config (``layer_types``...) made its first
value 6 times (``uniform``) or its values over and over (``cyclic``), is
lowered by ``text_generation.lower_decoder`` twice in one process: every
layer traced (``repeated.TRACED`` raised to 6), then 4 traced and the rest
repeated.  The table says whether the layers were repeated (or, where they
were traced whole, the log's reason) and whether the two ``.pte`` files are
the same byte for byte; a family whose two builds differ although its
layers were traced whole builds unlike twice in one process anyway.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
RESULTS = ROOT / "benchmarks" / "results" / "repeated_layers.txt"
LAYERS = 6
FORMS = {"host": {}, "device": {"target": "device"}, "int4": {"quantize": "int4"}}


def model(family: str, layer_types: str):
    import torch
    import transformers

    from coreai_partitioner import text_generation

    torch.manual_seed(0)
    config = text_generation.tiny_config(family)
    count = config.num_hidden_layers
    config.num_hidden_layers = LAYERS
    for name, value in list(vars(config).items()):
        if isinstance(value, list) and len(value) == count and count:
            setattr(config, name, [value[0]] * LAYERS if layer_types == "uniform" else [value[i % count] for i in range(LAYERS)])
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def row(family: str, form: str, layer_types: str, said: list[str]) -> list[str]:
    from coreai_partitioner import text_generation
    from coreai_partitioner.lowering import repeated

    shapes = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=8)
    try:
        built = model(family, layer_types)
        runs = []
        for traced in (LAYERS, repeated.TRACED):
            previous, repeated.TRACED = repeated.TRACED, traced
            said.clear()
            started = time.perf_counter()
            try:
                pte = bytes(text_generation.lower_decoder(built, shapes, **FORMS[form]).to_executorch().buffer)
            finally:
                repeated.TRACED = previous
            runs.append((hashlib.sha256(pte).hexdigest(), time.perf_counter() - started, " ".join(said)))
    except Exception as error:  # a config this sweep cannot build or a scheme it cannot store: said, not hidden
        return [family, form, f"not lowered: {type(error).__name__}: {str(error)[:80]}", "", "", ""]
    (whole, whole_s, _), (rep, rep_s, message) = runs
    traced = "4 of 6, repeated" if "repeated the last" in message else "whole: " + message.partition(": ")[2]
    return [family, form, traced, "same" if whole == rep else "differ", f"{whole_s:.1f}", f"{rep_s:.1f}"]


def main() -> None:
    from llm_helpers import ROWS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="*", default=list(ROWS))
    parser.add_argument("--forms", nargs="*", default=list(FORMS), choices=list(FORMS))
    parser.add_argument("--layer-types", default="uniform", choices=["uniform", "cyclic"])
    parser.add_argument("--results", type=Path, default=None, help=f"write the table here (default: print only; {RESULTS.name})")
    args = parser.parse_args()

    from coreai_partitioner import console
    from coreai_partitioner.lowering import repeated

    console.quiet_dependencies()

    said: list[str] = []

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    repeated.logger.addHandler(Said())
    repeated.logger.setLevel(logging.INFO)
    head = ["family", "form", "layers traced", ".pte", "whole s", "repeated s"]
    rows = []
    for family in args.families:
        for form in args.forms:
            rows.append(row(family, form, args.layer_types, said))
            print("  ".join(rows[-1]), flush=True)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    table = "\n".join("  ".join(cell.ljust(width) for cell, width in zip(r, widths)).rstrip() for r in [head, ["-" * w for w in widths], *rows])
    text = (f"{LAYERS}-layer tiny configs, layer types {args.layer_types}; each lowered with every layer traced, then with "
            f"4 traced and the rest repeated, in one process:\n\n    python benchmarks/repeated_layers.py --layer-types "
            f"{args.layer_types}\n\n{table}\n")
    print("\n" + text)
    if args.results is not None:
        args.results.write_text(text)


if __name__ == "__main__":
    main()
