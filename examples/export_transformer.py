"""Export a small transformer to a .pte whose Core AI delegate keeps its composite ops.

    python examples/export_transformer.py --layers 2 --dim 64 --out tiny_transformer.pte

RMSNorm and SDPA come from ``coreai_torch.composite_ops``; ``default_specs()``
externalizes them, and ``CoreAIPartitioner`` carries them through
``to_edge_transform_and_lower`` as ``noinline`` composite graphs
(``coreai_partitioner.lower`` does both steps).  The summary shows the
delegates, the composites each one calls, and the .pte size; the .pte then
runs in ExecuTorch's runtime against eager PyTorch.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from coreai_partitioner import console

# The dependencies' own logs and warnings (torch's deprecations inside coreai-torch's composite ops,
# coreai-torch's check that misreads the local "+cpu" build of torch 2.13.0): not the example's.
console.quiet_dependencies()

import torch  # noqa: E402
from tiny_transformer import TinyTransformer  # noqa: E402

from coreai_partitioner import lower, save_pte, verify  # noqa: E402
from coreai_partitioner.verify.describe import describe  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("tiny_transformer.pte"))
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TinyTransformer(layers=args.layers, dim=args.dim, heads=args.heads).eval()
    tokens = torch.randint(0, 128, (1, args.seq), dtype=torch.int32)

    start = time.perf_counter()
    save_pte(lower(model, (tokens,)), args.out)
    seconds = time.perf_counter() - start

    print(f"\n{type(model).__name__}(layers={args.layers}, dim={args.dim}) -> {args.out}, lowered in {seconds:.1f} s\n")
    print(describe(args.out))
    print("\nthe .pte on ExecuTorch's runtime (Core AI delegates on this machine's Core AI runtime) vs eager PyTorch:")
    with console.NativeStreams():  # coreai-core's runtime writes "ODIE [default]: Loading function ..." from C++
        report = verify.check(args.out, model, tokens)
    print(report)


if __name__ == "__main__":
    main()
