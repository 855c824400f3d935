"""Per-call overhead of the host Core AI backend in ExecuTorch's runtime.

    python benchmarks/runtime.py --calls 1000

Part 1 runs one tiny delegate (two RMSNorm composites and a Linear over a
2x4x16 input, fully delegated) ``--calls`` times each way, on the same asset
and the same input:

* coreai-core's own async API awaited in a running event loop (NDArray in,
  numpy out): the floor for any synchronous caller;
* coreai-core through ``LoadedAsset``, the synchronous call this package
  makes (the "direct" call the backend is held against);
* a portable-only ``.pte`` (``x + 1``) through ExecuTorch's Python binding,
  each call right after a direct one: what any ``.pte`` call costs before a
  backend is involved, with its code as cold as it is between delegate calls
  (warm in a tight loop it takes a fraction of that);
* the delegated ``.pte`` through ExecuTorch's runtime and the host backend,
  timing the ``LoadedAsset`` call inside it as well.

The machine is shared, so the ways take turns in blocks of ten calls and each
row is the median of its per-call times: a burst of load elsewhere falls on
all of them alike.  The backend's overhead per delegate call is the delegated
``.pte`` call minus the direct call minus the portable ``.pte`` call; the
target is under 100 us.  Part 2 times a full forward of the example transformer's
``.pte`` (several delegates' worth of work in one) against the in-memory run
of the same program, also taking turns.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from coreai_torch import get_decomp_table
from executorch.exir import to_edge, to_edge_transform_and_lower

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "examples")]

from coreai_partitioner import (  # noqa: E402
    CoreAIPartitioner,
    default_specs,
    externalize_modules,
    get_default_compile_config,
    get_default_passes,
    verify,
)
from coreai_partitioner.backends.apple_coreai.runtime import host as host_runtime  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.loaded_asset import LoadedAsset  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte  # noqa: E402
from coreai_torch.composite_ops import RMSNorm  # noqa: E402


class TwoNorms(torch.nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.n1 = RMSNorm(dim)
        self.lin = torch.nn.Linear(dim, dim)
        self.n2 = RMSNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.n2(self.lin(self.n1(x)))


class AddOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def lower(model: torch.nn.Module, *sample: torch.Tensor):
    export = lambda m: torch.export.export(m, sample).run_decompositions(get_decomp_table())  # noqa: E731
    ep, records = externalize_modules(model, default_specs(), export_fn=export)
    return to_edge_transform_and_lower(
        ep,
        partitioner=[CoreAIPartitioner(externalized_modules=records)],
        compile_config=get_default_compile_config(),
        transform_passes=get_default_passes(),
    )


class _TimedAsset(LoadedAsset):
    """A delegate's asset that also times its own calls (swapped in as the instance's class)."""

    seconds: list[float]

    def __call__(self, *args):
        start = time.perf_counter_ns()
        try:
            return super().__call__(*args)
        finally:
            self.seconds.append((time.perf_counter_ns() - start) / 1e3)


def taking_turns(ways: dict[str, Callable[[int], list[float]]], calls: int, block: int = 10) -> dict[str, float]:
    """Median us per call of each way; ``ways[name](n)`` makes n calls and returns each one's us.

    The ways take turns in blocks of ``block`` calls, after a warmup of ``block`` calls each.
    """
    for run in ways.values():
        run(block)
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(max(calls // block, 1)):
        for name, run in ways.items():
            samples[name] += run(block)
    return {name: statistics.median(values) for name, values in samples.items()}


def timed(fn: Callable[[], object]) -> Callable[[int], list[float]]:
    def run(n: int) -> list[float]:
        times = []
        for _ in range(n):
            start = time.perf_counter_ns()
            fn()
            times.append((time.perf_counter_ns() - start) / 1e3)
        return times

    return run


def awaited_in_a_loop(asset_path: Path, x: np.ndarray) -> Callable[[int], list[float]]:
    """coreai-core's async API on its own loop, each call awaited inside one running coroutine per block."""
    from coreai.authoring import AIModelAsset
    from coreai.runtime import NDArray

    loop = asyncio.new_event_loop()
    model = loop.run_until_complete(AIModelAsset.load(asset_path).executable().__aenter__())
    function = model.load_function("main")

    async def block(n: int) -> list[float]:
        times = []
        for _ in range(n):
            start = time.perf_counter_ns()
            outputs = await function({"x": NDArray(x)})
            {name: value.numpy() for name, value in outputs.items()}
            times.append((time.perf_counter_ns() - start) / 1e3)
        return times

    return lambda n: loop.run_until_complete(block(n))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--forward-calls", type=int, default=100)
    args = parser.parse_args()
    host_runtime.load_runtime_backend()
    from executorch.runtime import Runtime

    torch.manual_seed(0)
    x = torch.randn(2, 4, 16)
    pte = lower(TwoNorms().eval(), x).to_executorch().buffer
    x_np = x.numpy()
    plain = torch.export.export(AddOne(), (x,))
    portable_program = Runtime.get().load_program(to_edge(plain).to_executorch().buffer)
    portable = portable_program.load_method("forward")
    program = host_runtime.load_program(pte)  # keep it: a Method does not keep its Program alive
    method = program.load_method("forward")
    inside = host_runtime._delegates[max(host_runtime._delegates)].asset
    inside.__class__, inside.seconds = _TimedAsset, []
    with tempfile.TemporaryDirectory() as directory:
        asset_path = read_pte(pte).coreai_delegates()[0].asset_path(directory)
        asset = LoadedAsset(asset_path)
        floor = awaited_in_a_loop(asset_path, x_np)
    np.testing.assert_allclose(method.execute([x])[0].numpy(), asset({"x": x_np})[asset.output_names[0]], rtol=1e-6)
    after_direct: list[float] = []

    def direct_then_portable() -> None:
        asset({"x": x_np})
        start = time.perf_counter_ns()
        portable.execute([x])
        after_direct.append((time.perf_counter_ns() - start) / 1e3)

    median = taking_turns(
        {
            "floor": floor,
            "direct": timed(lambda: asset({"x": x_np})),
            "portable": timed(direct_then_portable),
            "pte": timed(lambda: method.execute([x])),
        },
        args.calls,
    )
    binding = statistics.median(after_direct[-args.calls:])
    inside_coreai = statistics.median(inside.seconds[-args.calls:])
    above_direct = median["pte"] - median["direct"]
    overhead = above_direct - binding

    rows = [
        ("coreai-core async API, awaited in a running loop", median["floor"]),
        ("coreai-core directly (LoadedAsset)", median["direct"]),
        ("portable-only .pte (x + 1) after a direct call", binding),
        ("delegated .pte, ExecuTorch + host backend", median["pte"]),
        ("  LoadedAsset call inside it", inside_coreai),
        (".pte call above the direct call", above_direct),
        ("backend overhead per delegate call", overhead),
    ]
    print(f"\ntiny delegate (TwoNorms, 2x4x16 fp32), {args.calls} calls each, taking turns; median per call")
    print(f"| {'path':<50} | {'us / call':>9} |")
    print(f"|{'-' * 52}|{'-' * 11}|")
    for name, value in rows:
        print(f"| {name:<50} | {value:>9.1f} |")
    print(f"target: backend overhead < 100 us -> {'met' if overhead < 100 else 'NOT met'}")

    from tiny_transformer import TinyTransformer

    model = TinyTransformer(layers=2, dim=64, heads=4).eval()
    tokens = torch.randint(0, 128, (1, 16), dtype=torch.int32)
    lowered = lower(model, tokens)
    program_bytes = lowered.to_executorch().buffer
    contents = read_pte(program_bytes)
    transformer = host_runtime.load_program(program_bytes)
    method = transformer.load_method("forward")
    median = taking_turns(
        {
            "pte": timed(lambda: method.execute([tokens])),
            "in_memory": timed(lambda: verify.run(lowered, tokens)),
        },
        args.forward_calls,
    )
    print(
        f"\nTinyTransformer (2 layers, d=64, 16 tokens): {len(contents.coreai_delegates())} delegate(s), "
        f"{len(contents.plans['forward'].instructions)} instruction(s), {args.forward_calls} calls each"
    )
    print(f"| {'path':<50} | {'ms / call':>9} |")
    print(f"|{'-' * 52}|{'-' * 11}|")
    print(f"| {'.pte forward, ExecuTorch + host backend':<50} | {median['pte'] / 1e3:>9.3f} |")
    print(f"| {'in-memory program, verify.run (PyTorch + Core AI)':<50} | {median['in_memory'] / 1e3:>9.3f} |")
    (out,) = method.execute([tokens])
    np.testing.assert_allclose(out.numpy(), model(tokens).detach().numpy(), rtol=1e-4, atol=1e-4)
    print("the .pte forward matches eager")


if __name__ == "__main__":
    main()
