"""A rank-0 result never leaves a Core AI delegate (``claims/scalar_results.py``).

coreai-core returns a rank-0 result as rank 1, which the program's rank-0
output cannot take: without the rule, each refused case here fails on
``execute``.  A rank-0 result read only inside the delegate lowers right and
is claimed with its readers.  The host runtime says what to do when a
``.pte`` hands one out all the same.
"""

from __future__ import annotations

import pytest
import torch
from helpers import Op, lower_plain, run_edge

from coreai_partitioner.partition import claims
from coreai_partitioner.partition.claims import scalar_results
from coreai_partitioner.verify.describe import outside_delegates

rows = torch.randn(5, 3)
vector = torch.randn(7)

#: name -> (model, sample, the op whose rank-0 result the program reads outside)
HANDED_OUT = {
    "sum returned": (Op(lambda x: x.sum()), (rows,), "sum"),
    "mean over every dim returned": (Op(lambda x: torch.mean(x, dim=(0, 1))), (rows,), "mean"),
    "sum plus a constant returned": (Op(lambda x: x.sum() + 1), (rows,), "sum"),
    "select of an element times two": (Op(lambda x: x[0, 1] * 2), (rows,), "select"),
}

#: rank-0 results read only by ops a delegate takes: claimed
READ_INSIDE = {
    "x minus its mean": (Op(lambda x: x - x.mean()), (rows,)),
    "x divided by its amax over every dim": (Op(lambda x: x / torch.amax(x, dim=(0, 1))), (rows,)),
    "sum made 1-element": (Op(lambda x: x.sum().reshape(1)), (rows,)),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(HANDED_OUT))
def test_a_rank0_result_the_program_reads_outside_stays_outside_and_the_pte_gives_eagers_result(case):
    model, sample, op = HANDED_OUT[case]
    edge, partitioner = lower_plain(model, sample)
    outside = outside_delegates(edge)["forward"]
    assert any(op in name for name in outside), f"{op} was claimed: outside are {dict(outside)}"
    assert any(op in name and "rank-0 result would leave" in reason for name, reasons in partitioner.refused.items() for reason in reasons)
    actual = run_edge(edge, sample)
    assert actual.shape == torch.Size([])
    torch.testing.assert_close(actual, model(*sample), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(READ_INSIDE))
def test_a_rank0_result_read_only_inside_the_delegate_is_claimed_whole_and_right(case):
    model, sample = READ_INSIDE[case]
    edge, partitioner = lower_plain(model, sample)
    assert not outside_delegates(edge)["forward"], partitioner.refused
    actual = run_edge(edge, sample)
    torch.testing.assert_close(actual, model(*sample), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_values_of_max_over_a_vector_stay_outside_with_their_int64_indices():
    # max.dim stays outside for its int64 indices; its rank-0 values entering a delegate would trap the runtime
    model, sample = Op(lambda v: v - torch.max(v, dim=0).values), (vector,)
    edge, _ = lower_plain(model, sample)
    assert {"aten.max.dim", "aten.sub.Tensor"} <= set(outside_delegates(edge)["forward"])
    actual = run_edge(edge, sample)
    torch.testing.assert_close(actual, model(*sample), rtol=0, atol=0)


@pytest.mark.slow
def test_a_pte_whose_delegate_hands_out_a_rank0_result_fails_saying_reshape_it(monkeypatch):
    from coreai_partitioner.backends.apple_coreai.runtime.host import last_error

    rules = [rule for rule in claims._RULES[claims.EVERY_OP] if rule is not scalar_results.scalar_result_leaves_the_delegate]
    monkeypatch.setitem(claims._RULES, claims.EVERY_OP, rules)  # a .pte lowered without the rule
    edge, _ = lower_plain(Op(lambda x: x.sum()), (rows,))
    assert not outside_delegates(edge)["forward"]
    with pytest.raises(RuntimeError):
        run_edge(edge, (rows,))
    assert "is rank 0 in the asset, returned as [1]: reshape(1) it in the model" in last_error()


def test_each_rank0_region_is_analysed_once_in_a_partitioning_and_judged_as_without_it(monkeypatch):
    """The partitioner asks of every node, and the rank-0 rules ask of a node's neighbours and its whole region:
    within ``claims.judging()`` each region is analysed once and each node judged once, with the same answers."""
    model = Op(lambda x: (x.sum() * 2 + 1) * x.mean())  # one region: sum, mean, mul, add, mul, returned
    graph = torch.export.export(model, (rows,)).graph
    nodes = [node for node in graph.nodes if node.op == "call_function"]
    regions, judged = [], []
    region, first_reason = scalar_results._region, claims._first_reason
    monkeypatch.setattr(scalar_results, "_region", lambda node: regions.append(node) or region(node))
    monkeypatch.setattr(claims, "_first_reason", lambda node, rules: judged.append((node, tuple(rules))) or first_reason(node, rules))

    afresh = {node.name: claims.refusal(node) for node in nodes}
    assert any(reason and "rank-0 result would leave" in reason for reason in afresh.values()), afresh
    assert len(regions) > 1 and len(judged) > len(set(judged))  # without it: the region again for each node
    regions.clear(), judged.clear()
    with claims.judging():
        remembered = {node.name: claims.refusal(node) for node in nodes}
        again = {node.name: claims.refusal(node) for node in nodes}
    assert remembered == again == afresh
    assert len(regions) == 1, regions
    assert len(judged) == len(set(judged)), "a node judged twice by the same rules"
