""".pte size of an fp16 LLM decoder, float and quantized with coreai-opt (coreai_partitioner.quantize).

    python benchmarks/quantize.py                       # tiny llama, qwen2, qwen3 and a 'small' qwen3
    python benchmarks/quantize.py --configs qwen3-0.6b   # the Qwen3-0.6B shape, random weights (needs ~13 GB; run alone)

Each row is one model exported as the LLM example does (``text_generation.lower_decoder``:
``forward(tokens, input_pos)`` with T symbolic, RMSNorm / SDPA / RoPE
composites), lowered three times in a process of its own per scheme: fp16,
int8 (per channel) and int4 (blocks of 32).  Sizes are of the whole ``.pte``,
scales, zero points and program included.  "weights" is the fp16 parameter
bytes, for how much of the ``.pte`` is fixed overhead.

A second table splits each ``.pte`` into what its scheme stores for the
weights (fp16: 2 bytes a weight; int8: 1 byte a weight and one fp16 scale per
output channel; int4: half a byte a weight and one fp16 scale per block) and
the fixed bytes: ExecuTorch's own (methods, metadata methods, segment
alignment) and the Core AI program.  The program is the same model in all
three files, so the target ratio bounds it: ``(stored_q + fixed + extra) /
(stored_fp16 + fixed) <= target`` holds only while ``fixed <= (target *
stored_fp16 - stored_q - extra) / (1 - target)``, ``extra`` being what the
dequantizing ops add.  That bound is the "allows" column.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore")

SCHEMES = ("fp16", "int8", "int4")
TARGETS = {"int8": 0.55, "int4": 0.30}
QWEN3_06B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
)
SMALL = dict(
    vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
    num_key_value_heads=4, head_dim=64, tie_word_embeddings=True,
)
CONFIGS = ("llama", "qwen2", "qwen3", "qwen3-small", "qwen3-0.6b")


def _config(name: str):
    import transformers

    from coreai_partitioner import text_generation

    if name == "qwen3-0.6b":
        return transformers.Qwen3Config(**QWEN3_06B)
    if name == "qwen3-small":
        return transformers.Qwen3Config(**SMALL)
    return text_generation.tiny_config(name)


def stored_bytes(model, scheme: str, block_size: int = 32) -> int:
    """What ``scheme`` stores for ``model``'s parameters: every Linear and embedding weight quantized, the rest fp16.

    A parameter whose values are all equal (the norms of a freshly initialized
    model) is one value in the asset, a splat.
    """
    import torch

    quantized = {id(m.weight) for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))}
    total = 0
    for parameter in {id(p): p for p in model.parameters()}.values():
        if bool((parameter == parameter.flatten()[0]).all()):
            total += 2
        elif scheme == "fp16" or id(parameter) not in quantized:
            total += parameter.numel() * 2
        elif scheme == "int8":
            total += parameter.numel() + parameter.shape[0] * 2
        else:
            total += parameter.numel() // 2 + parameter.numel() // block_size * 2
    return total


def measure(config_name: str, scheme: str, chunk: int, context: int) -> dict:
    """Export, (quantize,) lower and write one model as the LLM example does; the .pte size and time."""
    import tempfile
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM

    from coreai_partitioner import text_generation, save_pte
    from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(config_name), dtype=torch.float16).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    stored = stored_bytes(model, scheme)
    shapes = text_generation.DecoderShapes(max_context_len=context, prefill_chunk=chunk)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "model.pte"
        save_pte(text_generation.lower_decoder(model, shapes, quantize=None if scheme == "fp16" else scheme), path)
        contents = read_pte(path)
        executorch_bytes = contents.size - sum(d.asset_bytes for d in contents.delegates)
    return {"config": config_name, "scheme": scheme, "pte": contents.size, "weights": weights,
            "stored": stored, "executorch": executorch_bytes,
            "seconds": time.perf_counter() - start}


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e6:.2f} MB" if nbytes >= 1e6 else f"{nbytes / 1e3:.1f} kB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=["llama", "qwen2", "qwen3", "qwen3-small"])
    parser.add_argument("--prefill-chunk", type=int, default=8)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--one", nargs=2, metavar=("CONFIG", "SCHEME"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.prefill_chunk, args.context)))
        return

    from tabulate import tabulate

    rows, fixed_rows = [], []
    for config_name in args.configs:
        results = {}
        for scheme in SCHEMES:
            run = subprocess.run(
                [sys.executable, __file__, "--one", config_name, scheme,
                 "--prefill-chunk", str(args.prefill_chunk), "--context", str(args.context)],
                capture_output=True, text=True,
            )
            if run.returncode:
                sys.exit(f"{config_name} {scheme} failed:\n{run.stderr[-3000:]}")
            results[scheme] = json.loads(run.stdout.strip().splitlines()[-1])
        base = results["fp16"]["pte"]
        row = [config_name, _size(results["fp16"]["weights"]), _size(base)]
        for scheme in ("int8", "int4"):
            ratio = results[scheme]["pte"] / base
            verdict = "ok" if ratio <= TARGETS[scheme] else f"> {TARGETS[scheme]}"
            row += [_size(results[scheme]["pte"]), f"{ratio:.3f}x ({verdict})"]
        row.append(" / ".join(f"{results[scheme]['seconds']:.1f}" for scheme in SCHEMES))
        rows.append(row)
        fixed_rows.append(_fixed_row(config_name, results))
        print(" | ".join(row), flush=True)  # progress; the tables follow
    headers = ["model", "fp16 weights", "fp16 .pte", "int8 .pte", "int8 / fp16", "int4 .pte", "int4 / fp16",
               "export s (fp16 / int8 / int4)"]
    print(tabulate(rows, headers=headers, tablefmt="github"))
    print()
    fixed_headers = ["model", "fp16 fixed (ExecuTorch + Core AI program)", "int8 extra", "0.55x allows",
                     "int4 extra", "0.30x allows"]
    print(tabulate(fixed_rows, headers=fixed_headers, tablefmt="github"))


def _fixed_row(config_name: str, results: dict) -> list[str]:
    """The fp16 ``.pte``'s fixed bytes, and the most each target ratio allows (see the module docstring)."""
    def fixed(scheme: str) -> int:
        return results[scheme]["pte"] - results[scheme]["stored"]

    fp16 = results["fp16"]
    row = [config_name, f"{_size(fixed('fp16'))} ({_size(fp16['executorch'])} + {_size(fixed('fp16') - fp16['executorch'])})"]
    for scheme in ("int8", "int4"):
        extra = fixed(scheme) - fixed("fp16")
        target = TARGETS[scheme]
        allowed = (target * fp16["stored"] - results[scheme]["stored"] - extra) / (1 - target)
        row += [_size(extra), _size(allowed) if allowed > 0 else "none"]
    return row


if __name__ == "__main__":
    main()
