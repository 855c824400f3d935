"""Rules for rank-0 results: none may leave a Core AI delegate.

A Core AI program declares a rank-0 output (``x.sum()``, ``x[0, 1] * 2``), but
coreai-core's runtime returns it as rank 1 (shape ``[1]``): ExecuTorch's
rank-0 output cannot take it, and upstream's device runtime, which resizes an
output to the shape Core AI returns, fails the same way.  So a node whose
rank-0 result a delegate would hand out (the program's output, or a reader
left outside) stays outside; one whose rank-0 result is read only inside the
delegate (``x - x.mean()``) lowers right and is claimed.

:mod:`.scalars` keeps the readers of a rank-0 tensor from outside with it, so
the question is one of a *region*: the rank-0 values linked by their readers.
:func:`stays_outside` finds what of a region must stay outside, starting from
what stays outside on its own and spreading along rank-0 values both ways.
"""

from __future__ import annotations

import operator

import torch

from coreai_partitioner import _compat
from coreai_partitioner.partition.claims import EVERY_OP, is_rank0, judged, left_outside, own_refusal, refuses, value
from coreai_partitioner.partition.claims.data_dependent import data_dependent_size

@refuses(EVERY_OP)
def scalar_result_leaves_the_delegate(node: torch.fx.Node) -> str | None:
    if not _produces_rank0(node) or node.target is operator.getitem:
        return None
    outside = stays_outside(node)
    readers = [reader for result in _rank0_results(node) for reader in result.users if reader in outside]
    if not readers:
        return None
    where = "the program's output" if any(r.op == "output" for r in readers) else ", ".join(r.name for r in readers)
    return (
        f"its rank-0 result would leave the delegate (read by {where}): coreai-core returns a rank-0 result as "
        "rank 1, which the program's rank-0 tensor cannot take; make it 1-element (reshape(1)) to keep it inside"
    )


def stays_outside(node: torch.fx.Node) -> set[torch.fx.Node]:
    """The nodes of ``node``'s rank-0 region that cannot be in a delegate, with its rank-0 values kept inside.

    Within :func:`~coreai_partitioner.partition.claims.judging` each region is
    analysed once, for the first of its nodes asked, and the answer kept for all.
    """
    table = judged("rank-0 region")
    if table is not None and node in table:
        return table[node]
    region = _region(node)
    outside = _outside_of(region)
    if table is not None:
        table.update(dict.fromkeys(region, outside))
    return outside


def _outside_of(region: set[torch.fx.Node]) -> set[torch.fx.Node]:
    outside = {member for member in region if _outside_on_its_own(member)}
    grown = True
    while grown:
        grown = False
        for member in region - outside:
            if _crosses(member, outside):
                outside.add(member)
                grown = True
    return outside


def _region(start: torch.fx.Node) -> set[torch.fx.Node]:
    """The rank-0 values linked to ``start`` through their readers, and those readers."""
    region, pending = set(), [start]
    while pending:
        member = pending.pop()
        if member in region:
            continue
        region.add(member)
        pending.extend(operand for operand in member.all_input_nodes if is_rank0(value(operand)))
        if member.target is operator.getitem:
            pending.append(member.args[0])
        if _produces_rank0(member):
            pending.extend(reader for result in _rank0_results(member) for reader in (result, *result.users))
    return region


def _crosses(member: torch.fx.Node, outside: set[torch.fx.Node]) -> bool:
    """Whether ``member`` inside a delegate would take a rank-0 tensor from ``outside`` or hand one to it."""
    if member.target is operator.getitem:
        return member.args[0] in outside
    if any(is_rank0(value(operand)) and operand in outside for operand in member.all_input_nodes):
        return True
    return _produces_rank0(member) and any(
        reader in outside or (result is not member and result in outside)
        for result in _rank0_results(member)
        for reader in result.users
    )


def _outside_on_its_own(node: torch.fx.Node) -> bool:
    """Whether ``node`` is no part of a delegate whatever its rank-0 operands and readers are: the program's output, or
    left outside by what it is, by ExecuTorch's do-not-delegate tag, or by a rule of its own op."""
    return node.op == "output" or left_outside(node, _refused_by_its_op)


def _refused_by_its_op(node: torch.fx.Node) -> bool:
    """Tagged, refused by a rule of its op, or sized by data (a rule of every op that reads no neighbour)."""
    return (
        bool(node.meta.get(_compat.DO_NOT_DELEGATE_TAG, False))
        or own_refusal(node) is not None
        or data_dependent_size(node) is not None
    )


def _rank0_results(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes that carry ``node``'s rank-0 results: itself, or its getitems for an op with several results."""
    if not isinstance(value(node), (tuple, list)):
        return [node] if is_rank0(value(node)) else []
    return [reader for reader in node.users if reader.target is operator.getitem and is_rank0(value(reader))]


def _produces_rank0(node: torch.fx.Node) -> bool:
    result = value(node)
    if isinstance(result, (tuple, list)):
        return any(is_rank0(part) for part in result)
    return is_rank0(result)
