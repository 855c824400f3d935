"""Re-resolution on hand-built FX graphs: no export, no ExecuTorch, no Core AI."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch
import torch.fx as fx

from coreai_partitioner.call_sites import (
    EXTERNALIZE_NAMESPACE,
    call_sites_by_op,
    externalized_op_name,
    records_in_graph,
    resolve_call_sites,
)


class Target:
    """Stands in for an op overload: ATen form ``op.default``, edge form ``ns.op.default``."""

    def __init__(self, op_name: str, *, edge: bool = False, namespace: str = EXTERNALIZE_NAMESPACE):
        self.namespace = namespace
        self.__name__ = f"{namespace}.{op_name}.default" if edge else f"{op_name}.default"

    def __call__(self, *args):
        raise NotImplementedError


@dataclasses.dataclass
class Record:
    name: str
    op_name: str
    source_nodes: list[str]
    exported_program: SimpleNamespace


def graph_of(*calls: tuple[str, Target]) -> fx.Graph:
    """A chain x -> call -> call ... with the given node names and targets."""
    graph = fx.Graph()
    value = graph.placeholder("x")
    for name, target in calls:
        value = graph.call_function(target, (value,))
        value.name = name
    graph.output(value)
    return graph


def record(path: str, op_name: str, source: str, sub_graph: fx.Graph | None = None) -> Record:
    return Record(f"{path}_0123abcd", op_name, [source], SimpleNamespace(graph=sub_graph or graph_of()))


def test_renamed_call_sites_resolve_by_op_target():
    graph = graph_of(
        ("coreai_torch_ext_n1_norm_aa_default", Target("n1_norm_aa", edge=True)),
        ("aten_relu", Target("relu", namespace="aten")),
        ("coreai_torch_ext_n2_norm_aa_default", Target("n2_norm_aa", edge=True)),
    )
    records = [record("n1.norm", "n1_norm_aa", "n1_norm_aa"), record("n2.norm", "n2_norm_aa", "n2_norm_aa")]

    resolution = resolve_call_sites(records, [graph])

    assert [r.source_nodes for r in resolution.records] == [
        ["coreai_torch_ext_n1_norm_aa_default"],
        ["coreai_torch_ext_n2_norm_aa_default"],
    ]
    assert resolution.mismatches == ()


def test_shared_instance_call_sites_pair_in_graph_order():
    # Names that sort the other way round: only graph order may decide.
    graph = graph_of(("z_second_name", Target("norm_bb")), ("a_first_name", Target("norm_bb")))
    records = [record("norm", "norm_bb", "norm_bb"), record("norm", "norm_bb", "norm_bb_1")]

    resolved = resolve_call_sites(records, [graph]).records

    assert [r.source_nodes for r in resolved] == [["z_second_name"], ["a_first_name"]]


def test_edge_and_aten_forms_of_one_op_are_the_same_call_site():
    assert externalized_op_name(Target("blk_cc", edge=True)) == "blk_cc"
    assert externalized_op_name(Target("blk_cc")) == "blk_cc"
    assert externalized_op_name(Target("relu", namespace="aten")) is None
    assert externalized_op_name(torch.ops.aten.relu.default) is None
    assert externalized_op_name(len) is None


def test_real_custom_op_overload_is_recognized():
    @torch.library.custom_op(f"{EXTERNALIZE_NAMESPACE}::call_sites_unit_op", mutates_args=())
    def unit_op(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    overload = getattr(torch.ops, EXTERNALIZE_NAMESPACE).call_sites_unit_op.default
    assert externalized_op_name(overload) == "call_sites_unit_op"


def test_count_mismatch_keeps_recorded_names_and_names_the_op_path_and_counts():
    graph = graph_of(("renamed", Target("norm_dd")))
    records = [record("layers.0.norm", "norm_dd", "norm_dd"), record("layers.0.norm", "norm_dd", "norm_dd_1")]

    resolution = resolve_call_sites(records, [graph])

    assert [r.source_nodes for r in resolution.records] == [["norm_dd"], ["norm_dd_1"]]
    (mismatch,) = resolution.mismatches
    assert (mismatch.op_name, mismatch.module_path, mismatch.call_sites, mismatch.records) == (
        "norm_dd",
        "layers.0.norm",
        1,
        2,
    )
    message = str(mismatch)
    for text in ("layers.0.norm", "coreai_torch_ext::norm_dd", "1 call site", "2 record"):
        assert text in message


def test_op_absent_from_every_graph_is_reported_as_records_of_another_program():
    records = [record("old.norm", "norm_ee", "norm_ee")]

    (mismatch,) = resolve_call_sites(records, [graph_of()]).mismatches

    assert mismatch.call_sites == 0
    assert "different model or an older export" in str(mismatch)


def test_resolved_records_are_new_objects_and_the_callers_are_untouched():
    graph = graph_of(("renamed", Target("norm_ff")))
    original = record("norm", "norm_ff", "norm_ff")

    (resolved,) = resolve_call_sites([original], [graph]).records

    assert resolved is not original
    assert original.source_nodes == ["norm_ff"]
    assert resolved.source_nodes == ["renamed"]
    assert resolved.exported_program is original.exported_program  # shared, not copied


def test_three_levels_of_nesting_resolve_in_each_parents_sub_export():
    # top graph -> block (renamed by to_edge); block's sub-export -> attn; attn's -> norm.
    norm_sub = graph_of(("mul", Target("mul", namespace="aten")))
    attn_sub = graph_of(("block_attn_norm_gg", Target("block_attn_norm_gg")))
    block_sub = graph_of(("block_attn_gg", Target("block_attn_gg")))
    top = graph_of(("coreai_torch_ext_block_gg_default", Target("block_gg", edge=True)))
    records = [
        record("block", "block_gg", "block_gg", block_sub),
        record("block.attn", "block_attn_gg", "block_attn_gg", attn_sub),
        record("block.attn.norm", "block_attn_norm_gg", "block_attn_norm_gg", norm_sub),
    ]

    resolution = resolve_call_sites(records, [top] + [r.exported_program.graph for r in records])

    assert resolution.mismatches == ()
    assert [r.source_nodes for r in resolution.records] == [
        ["coreai_torch_ext_block_gg_default"],
        ["block_attn_gg"],
        ["block_attn_norm_gg"],
    ]
    assert records_in_graph(resolution.records, top) == list(resolution.records)


def test_nested_child_of_a_parent_called_twice_names_its_site_in_both_sub_exports():
    first = graph_of(("inner_hh", Target("inner_hh")))
    second = graph_of(("inner_hh", Target("inner_hh")))
    top = graph_of(("p0", Target("outer_hh")), ("p1", Target("outer_hh")))
    records = [
        record("outer", "outer_hh", "outer_hh", first),
        record("outer", "outer_hh", "outer_hh_1", second),
        record("outer.inner", "inner_hh", "inner_hh"),
    ]

    resolution = resolve_call_sites(records, [top, first, second])

    assert resolution.mismatches == ()
    assert [r.source_nodes for r in resolution.records] == [["p0"], ["p1"], ["inner_hh"]]


def test_records_in_graph_keeps_only_the_delegates_call_sites_and_their_nested_records():
    inner_sub = graph_of(("blk_inner_ii", Target("blk_inner_ii")))
    delegate_a = graph_of(("a_site", Target("blk_ii")))
    delegate_b = graph_of(("b_site", Target("tail_ii")))
    records = [
        record("blk", "blk_ii", "a_site", inner_sub),
        record("blk.inner", "blk_inner_ii", "blk_inner_ii"),
        record("tail", "tail_ii", "b_site"),
    ]

    assert [r.name for r in records_in_graph(records, delegate_a)] == [records[0].name, records[1].name]
    assert [r.name for r in records_in_graph(records, delegate_b)] == [records[2].name]


class CountingGraph(fx.Graph):
    """Counts how often its node list is walked."""

    walks = 0

    @property
    def nodes(self):
        CountingGraph.walks += 1
        return super().nodes


def test_each_graph_is_walked_once_whatever_the_number_of_ops():
    graph = CountingGraph()
    value = graph.placeholder("x")
    records = []
    for i in range(200):
        op_name = f"op{i}_jj"
        value = graph.call_function(Target(op_name), (value,))
        records.append(record(f"m{i}", op_name, op_name))
    graph.output(value)
    CountingGraph.walks = 0

    resolution = resolve_call_sites(records, [graph])

    assert CountingGraph.walks == 1
    assert resolution.mismatches == ()


def test_call_sites_by_op_buckets_in_graph_order():
    graph = graph_of(("a", Target("x_kk")), ("b", Target("y_kk")), ("c", Target("x_kk")))
    assert {op: [n.name for n in nodes] for op, nodes in call_sites_by_op(graph).items()} == {
        "x_kk": ["a", "c"],
        "y_kk": ["b"],
    }


def test_namespace_is_coreai_torchs():
    from coreai_partitioner import _compat

    assert EXTERNALIZE_NAMESPACE == _compat.EXTERNALIZE_NAMESPACE


def test_the_same_graph_passed_twice_is_searched_once():
    graph = graph_of(("renamed", Target("norm_ll")))
    resolution = resolve_call_sites([record("norm", "norm_ll", "norm_ll")], [graph, graph])
    assert resolution.mismatches == ()
    assert resolution.records[0].source_nodes == ["renamed"]
