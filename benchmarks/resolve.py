"""Re-resolution cost: a synthetic graph, and its share of a real lowering.

    python benchmarks/resolve.py --nodes 100000 --call-sites 10000 --lowering-layers 32

Part 1 times ``resolve_call_sites`` on a synthetic FX graph of ``--nodes``
nodes of which ``--call-sites`` are externalized call sites (renamed, as
``to_edge`` does, with 4 call sites per op), against a target of 1 microsecond
per node.  Part 2 lowers the benchmark model with ``--lowering-layers``
layers and reports the time spent in re-resolution against the whole lowering
(target: under 1%).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch.fx as fx

from coreai_partitioner.records.call_sites import EXTERNALIZE_NAMESPACE, resolve_call_sites


class _Target:
    def __init__(self, op_name: str) -> None:
        self.namespace = EXTERNALIZE_NAMESPACE
        self.__name__ = f"{EXTERNALIZE_NAMESPACE}.{op_name}.default"

    def __call__(self, *args):
        raise NotImplementedError


@dataclass
class _Record:
    name: str
    op_name: str
    source_nodes: list
    exported_program: SimpleNamespace


def synthetic(nodes: int, call_sites: int, sites_per_op: int = 4):
    graph = fx.Graph()
    value = graph.placeholder("x")
    relu = _Target("unused")
    relu.namespace = "aten"
    targets = [_Target(f"op{i}_0123abcd") for i in range(call_sites // sites_per_op)]
    every = max(1, nodes // call_sites)
    records = []
    sub = SimpleNamespace(graph=fx.Graph())
    for i in range(nodes - 2):
        index = len(records)
        site = i % every == 0 and index < call_sites
        target = targets[index // sites_per_op] if site else relu
        value = graph.call_function(target, (value,))
        if site:
            op_name = target.__name__.split(".")[1]
            value.name = f"coreai_torch_ext_{op_name}_default_{index}"
            records.append(_Record(f"m{index}_0123abcd", op_name, ["old"], sub))
    graph.output(value)
    return graph, records


def part_one(nodes: int, call_sites: int, repeats: int) -> None:
    graph, records = synthetic(nodes, call_sites)
    count = len(graph.nodes)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        resolution = resolve_call_sites(records, [graph])
        best = min(best, time.perf_counter() - start)
    assert not resolution.mismatches
    per_node = best / count * 1e6
    print(f"synthetic graph: {count:,} nodes, {len(records):,} call sites")
    print(f"  resolve_call_sites: {best * 1e3:.1f} ms = {per_node:.3f} us/node (target <= 1 us/node: {'ok' if per_node <= 1 else 'MISSED'})")


def part_two(layers: int, dim: int) -> None:
    warnings.simplefilter("ignore")
    import torch
    from coreai_torch import get_decomp_table
    from executorch.exir import to_edge_transform_and_lower

    import coreai_partitioner.backends.apple_coreai.convert as convert_module
    import coreai_partitioner.partition.partitioner as partitioner_module
    from coreai_partitioner import (
        CoreAIPartitioner,
        default_specs,
        externalize_modules,
        get_default_compile_config,
        get_default_passes,
    )

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from model import build

    spent = [0.0]

    def timed(fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start

        return wrapper

    # The partitioner pairs call sites with records; the backend reads them back off its own call sites.
    partitioner_module.pair_call_sites = timed(partitioner_module.pair_call_sites)
    convert_module.delegate_call_sites = timed(convert_module.delegate_call_sites)

    model, x = build(layers, dim)
    ep, records = externalize_modules(
        model, default_specs(), export_fn=lambda m: torch.export.export(m, (x,)).run_decompositions(get_decomp_table())
    )
    start = time.perf_counter()
    to_edge_transform_and_lower(
        ep,
        partitioner=[CoreAIPartitioner(externalized_modules=records)],
        compile_config=get_default_compile_config(),
        transform_passes=get_default_passes(),
    )
    lowering = time.perf_counter() - start
    share = spent[0] / lowering * 100
    print(f"lowering L={layers} d={dim}: {len(records)} call sites, {lowering:.2f} s")
    print(f"  re-resolution (partition + preprocess): {spent[0] * 1e3:.2f} ms = {share:.3f}% of lowering (target < 1%: {'ok' if share < 1 else 'MISSED'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--call-sites", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lowering-layers", type=int, default=32, help="0 skips part 2")
    parser.add_argument("--dim", type=int, default=256)
    args = parser.parse_args()
    part_one(args.nodes, args.call_sites, args.repeats)
    if args.lowering_layers:
        part_two(args.lowering_layers, args.dim)


if __name__ == "__main__":
    main()
