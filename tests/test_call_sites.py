"""Re-resolution on hand-built FX graphs: no export, no ExecuTorch, no Core AI."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch
import torch.fx as fx

import pytest

from coreai_partitioner.records.carried import claim_call_sites, delegate_call_sites
from coreai_partitioner.records.call_sites import (
    EXTERNALIZE_NAMESPACE,
    call_site_signature,
    call_sites_by_op,
    externalized_op_name,
    pair_call_sites,
    record_signature,
    resolve_call_sites,
    signatures_match,
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


def test_count_mismatch_pairs_what_it_can_and_names_the_op_path_and_counts():
    graph = graph_of(("renamed", Target("norm_dd")))
    records = [record("layers.0.norm", "norm_dd", "norm_dd"), record("layers.0.norm", "norm_dd", "norm_dd_1")]

    resolution = resolve_call_sites(records, [graph])

    # One instance, indistinguishable signatures: the one call site takes the first record.
    assert [r.source_nodes for r in resolution.records] == [["renamed"], ["norm_dd_1"]]
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
    graph = CountingGraph()
    graph.output(graph.call_function(Target("norm_ll"), (graph.placeholder("x"),)))
    CountingGraph.walks = 0

    resolution = resolve_call_sites([record("norm", "norm_ll", "norm_ll")], [graph, graph])

    assert CountingGraph.walks == 1
    assert resolution.mismatches == ()
    assert resolution.records[0].source_nodes == [next(iter(call_sites_by_op(graph)["norm_ll"])).name]


# ------------------------------------------------------------ pairing checked by signature


def typed_graph(*calls: tuple[str, Target, tuple[int, ...]]) -> fx.Graph:
    """Independent call sites, each on its own input of the given shape (``meta["val"]`` set)."""
    graph = fx.Graph()
    outputs = []
    for name, target, shape in calls:
        x = graph.placeholder(f"x_{name}")
        x.meta["val"] = torch.empty(shape)
        node = graph.call_function(target, (x,))
        node.name = name
        outputs.append(node)
    graph.output(tuple(outputs))
    return graph


def typed_record(path: str, op_name: str, source: str, shape: tuple[int, ...]) -> Record:
    """A record whose sub-export takes one user input of ``shape``."""
    sub = fx.Graph()
    x = sub.placeholder("x")
    x.meta["val"] = torch.empty(shape)
    sub.output(x)
    user_input = SimpleNamespace(kind=SimpleNamespace(name="USER_INPUT"))
    program = SimpleNamespace(graph=sub, graph_signature=SimpleNamespace(input_specs=[user_input]))
    return Record(f"{path}_0123abcd", op_name, [source], program)


def test_reordered_call_sites_of_different_shapes_pair_by_signature():
    # A pass moved the [2, 8] call site ahead of the [4, 16] one.
    graph = typed_graph(("late", Target("norm_mm"), (2, 8)), ("early", Target("norm_mm"), (4, 16)))
    records = [typed_record("norm", "norm_mm", "norm_mm", (4, 16)), typed_record("norm", "norm_mm", "norm_mm_1", (2, 8))]

    pairing = pair_call_sites(records, [graph])

    assert {node.name: index for node, index in pairing.records.items()} == {"early": 0, "late": 1}
    assert pairing.unpaired == {}


def test_call_sites_in_recorded_order_pair_in_graph_order():
    graph = typed_graph(("first", Target("norm_nn"), (4, 16)), ("second", Target("norm_nn"), (4, 16)))
    records = [typed_record("norm", "norm_nn", "a", (4, 16)), typed_record("norm", "norm_nn", "b", (4, 16))]

    pairing = pair_call_sites(records, [graph])

    assert [(node.name, index) for node, index in pairing.records.items()] == [("first", 0), ("second", 1)]


def test_a_call_site_no_record_was_exported_for_is_left_unpaired_with_the_shapes():
    graph = typed_graph(("site", Target("norm_oo"), (3, 5)), ("other", Target("norm_oo"), (4, 16)))
    records = [typed_record("norm", "norm_oo", "a", (4, 16))]

    pairing = pair_call_sites(records, [graph])

    assert [node.name for node in pairing.records] == ["other"]
    ((node, reason),) = pairing.unpaired.items()
    assert node.name == "site"
    assert "float32[3, 5]" in reason and "float32[4, 16]" in reason
    (mismatch,) = pairing.mismatches
    assert (mismatch.call_sites, mismatch.records) == (2, 1)


def test_a_call_site_fitting_records_of_two_signatures_is_ambiguous():
    graph = typed_graph(("a", Target("norm_pp"), (4, 16)), ("b", Target("norm_pp"), (2, 16)))
    graph.find_nodes(op="placeholder")[0].meta["val"] = None  # unknown inputs fit every record
    records = [typed_record("norm", "norm_pp", "r0", (2, 16)), typed_record("norm", "norm_pp", "r1", (4, 16))]

    pairing = pair_call_sites(records, [graph])

    assert [node.name for node in pairing.records] == ["b"]
    (reason,) = pairing.unpaired.values()
    assert "cannot be told" in reason


def test_symbolic_dims_match_any_size():
    assert signatures_match((((None, 16), torch.float32),), (((7, 16), torch.float32),))
    assert not signatures_match((((None, 16), torch.float32),), (((7, 8), torch.float32),))
    assert not signatures_match((((7, 16), torch.float16),), (((7, 16), torch.float32),))
    # get_default_passes() narrows 64-bit inputs: an int64 record fits an int32 call site.
    graph = typed_graph(("s", Target("x_qq"), (2,)))
    graph.find_nodes(op="placeholder")[0].meta["val"] = torch.empty(2, dtype=torch.int32)
    narrowed = typed_record("x", "x_qq", "x_qq", (2,))
    narrowed.exported_program.graph.find_nodes(op="placeholder")[0].meta["val"] = torch.empty(2, dtype=torch.int64)
    (site,) = call_sites_by_op(graph)["x_qq"]
    assert signatures_match(call_site_signature(site), record_signature(narrowed))


# ------------------------------------------------------------ records carried on the call sites


def test_claimed_call_sites_carry_their_record_and_nested_records_through_deep_copies():
    import copy

    inner_sub = graph_of(("blk_inner_rr", Target("blk_inner_rr")))
    top = graph_of(("a_site", Target("blk_rr")), ("b_site", Target("tail_rr")))
    records = [
        record("blk", "blk_rr", "blk_rr", inner_sub),
        record("blk.inner", "blk_inner_rr", "blk_inner_rr"),
        record("tail", "tail_rr", "tail_rr"),
    ]
    pairing = pair_call_sites(records, [top] + [r.exported_program.graph for r in records])

    assert claim_call_sites(records, pairing.by_graph(), top) == 2
    copied = copy.deepcopy(fx.GraphModule(torch.nn.Module(), top)).graph

    sites = {node.name: claimed for node, claimed in delegate_call_sites(copied)}
    assert sites["a_site"].record is records[0]  # the same record, never a copy
    assert sites["a_site"].nested["blk_inner_rr"].record is records[1]
    assert sites["b_site"].record is records[2] and sites["b_site"].nested == {}


def test_a_call_site_without_a_record_stops_the_backend_with_the_fix():
    graph = graph_of(("lonely", Target("norm_ss")))
    with pytest.raises(RuntimeError, match="lonely.*without a record.*externalized_modules=records"):
        list(delegate_call_sites(graph))


def test_a_carried_record_refuses_to_be_pickled():
    import pickle

    from coreai_partitioner.records.carried import CallSiteRecord

    with pytest.raises(TypeError, match="norm.*build-time state"):
        pickle.dumps(CallSiteRecord(record("norm", "norm_tt", "norm_tt")))
