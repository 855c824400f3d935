"""Export a small transformer to a .pte whose Core AI delegate keeps its composite ops.

    python examples/export_transformer.py --layers 2 --dim 64 --out tiny_transformer.pte

RMSNorm and SDPA come from ``coreai_torch.composite_ops``; ``default_specs()``
externalizes them, and ``CoreAIPartitioner`` carries them through
``to_edge_transform_and_lower`` as ``noinline`` composite graphs.  The summary
shows the delegates, the composites each one calls, and the .pte size; the
.pte's delegate then runs on this machine's Core AI runtime against eager PyTorch.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import warnings
from pathlib import Path

# Deprecation notices from torch inside coreai-torch's composite ops, and
# coreai-torch's check that misreads the local "+cpu" build of torch 2.13.0.
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message="coreai-torch has only been validated")

import torch
from coreai_torch import get_decomp_table
from executorch.exir import to_edge_transform_and_lower
from tiny_transformer import TinyTransformer

from coreai_partitioner import (
    CoreAIPartitioner,
    default_specs,
    externalize_modules,
    get_default_compile_config,
    get_default_passes,
    verify,
)
from coreai_partitioner.assets import asset_ir, summarize_ir
from coreai_partitioner.pte import read_pte


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("tiny_transformer.pte"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    torch.manual_seed(0)
    model = TinyTransformer(layers=args.layers, dim=args.dim, heads=args.heads).eval()
    tokens = torch.randint(0, 128, (1, args.seq), dtype=torch.int32)

    start = time.perf_counter()
    ep, records = externalize_modules(
        model,
        default_specs(),
        export_fn=lambda m: torch.export.export(m, (tokens,)).run_decompositions(get_decomp_table()),
    )
    lowered = to_edge_transform_and_lower(
        ep,
        partitioner=[CoreAIPartitioner(externalized_modules=records)],
        compile_config=get_default_compile_config(),
        transform_passes=get_default_passes(),
    )
    program = lowered.to_executorch()
    args.out.write_bytes(program.buffer)
    seconds = time.perf_counter() - start

    pte = read_pte(args.out)
    print(f"\n{type(model).__name__}(layers={args.layers}, dim={args.dim}) -> {args.out}")
    print(f"  externalized call sites: {len(records)}")
    with tempfile.TemporaryDirectory() as directory:
        for method in pte.methods:
            delegates = [d for d in pte.delegates if d.method == method]
            print(f"  method '{method}': {len(delegates)} delegate(s)")
            for delegate in delegates:
                path = delegate.asset_path(directory)
                composites = summarize_ir(asset_ir(path)).composites()
                listed = ", ".join(f"{name} x{n}" for name, n in sorted(composites.items())) or "none"
                print(
                    f"    delegate {delegate.index}: {delegate.backend_id}, {delegate.packaging}, "
                    f"{delegate.asset_bytes:,} bytes; composites: {listed}"
                )
    print(f"  .pte size: {pte.size:,} bytes, lowered in {seconds:.1f} s\n")
    print("the .pte's delegate on the Core AI runtime vs eager PyTorch:")
    print(verify.check(args.out, model, tokens))


if __name__ == "__main__":
    main()
