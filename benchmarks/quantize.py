""".pte size of an fp16 LLM decoder, float and quantized with coreai-opt (coreai_partitioner.quantize).

    python benchmarks/quantize.py                       # tiny llama, qwen2, qwen3 and a 'small' qwen3
    python benchmarks/quantize.py --configs qwen3-0.6b   # the Qwen3-0.6B shape, random weights (needs ~13 GB; run alone)

Each row is one model exported as the LLM example does (``hf.StaticCacheDecoder``,
``forward(tokens, input_pos)`` with T symbolic, RMSNorm / SDPA / RoPE
composites), lowered three times in a process of its own per scheme: fp16,
int8 (per channel) and int4 (blocks of 32).  Sizes are of the whole ``.pte``,
scales, zero points and program included.  "weights" is the fp16 parameter
bytes, for how much of the ``.pte`` is fixed overhead.
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

    from coreai_partitioner import hf

    if name == "qwen3-0.6b":
        return transformers.Qwen3Config(**QWEN3_06B)
    if name == "qwen3-small":
        return transformers.Qwen3Config(**SMALL)
    return hf.tiny_config(name)


def measure(config_name: str, scheme: str, chunk: int, context: int) -> dict:
    """Export, (quantize,) lower and serialize one model; the .pte size and phase times."""
    import torch
    from coreai_torch import get_decomp_table
    from executorch.exir import to_edge_transform_and_lower
    from transformers import AutoModelForCausalLM

    from coreai_partitioner import CoreAIPartitioner, default_specs, externalize_modules, get_default_compile_config, hf
    from coreai_partitioner.passes import get_default_passes
    from coreai_partitioner.quantize import quantize

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(config_name), torch_dtype=torch.float16).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    tokens = torch.export.Dim("T", min=1, max=chunk)
    dynamic_shapes = ({1: tokens}, {0: tokens})
    sample = (torch.zeros(1, 2, dtype=torch.long), torch.arange(2))
    times = {}
    start = time.perf_counter()
    with hf.coreai_composites(model), torch.no_grad():
        program, records = externalize_modules(
            hf.StaticCacheDecoder(model, context).eval(), default_specs(),
            export_fn=lambda m: torch.export.export(m, sample, dynamic_shapes=dynamic_shapes),
        )
    times["export"] = time.perf_counter() - start
    start = time.perf_counter()
    if scheme == "fp16":
        program = program.run_decompositions(get_decomp_table())
    else:
        program = quantize(program, scheme, records=records, dynamic_shapes=dynamic_shapes)
    times["quantize"] = time.perf_counter() - start
    start = time.perf_counter()
    lowered = to_edge_transform_and_lower(
        program, partitioner=[CoreAIPartitioner(externalized_modules=records)],
        compile_config=get_default_compile_config(), transform_passes=get_default_passes(),
    )
    size = len(lowered.to_executorch().buffer)
    times["lower"] = time.perf_counter() - start
    return {"config": config_name, "scheme": scheme, "pte": size, "weights": weights, "seconds": times}


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

    rows = []
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
        row = [config_name, f"{results['fp16']['weights'] / 1e6:.2f}", f"{base / 1e6:.2f}"]
        for scheme in ("int8", "int4"):
            ratio = results[scheme]["pte"] / base
            verdict = "ok" if ratio <= TARGETS[scheme] else f"> {TARGETS[scheme]}"
            row += [f"{results[scheme]['pte'] / 1e6:.2f}", f"{ratio:.3f}x ({verdict})", f"{results[scheme]['seconds']['quantize']:.1f}"]
        rows.append(row)
        print(" | ".join(row), flush=True)  # progress; the table follows
    headers = ["model", "fp16 weights MB", "fp16 .pte MB", "int8 .pte MB", "int8 / fp16", "int8 quantize s",
               "int4 .pte MB", "int4 / fp16", "int4 quantize s"]
    print(tabulate(rows, headers=headers, tablefmt="github"))


if __name__ == "__main__":
    main()
