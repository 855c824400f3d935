"""Rules for indexed writes (``aten.index_put``).

coreai-torch lowers ``index_put`` to ``coreai.scatter_nd``: it refuses
``accumulate=True`` ("index_put with accumulate=True is not supported"), and
values that must be broadcast over the indexed rows are scattered without the
broadcast (a silently wrong result), so only values of the indexed shape are
claimed.  A symbolic size past dim 0 it refuses ("index_put currently only
supports dynamic batch dimension (dim 0)").
"""

from __future__ import annotations

import torch

from coreai_partitioner.partition.claims import argument, refuses, value


@refuses(torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default)
def unsupported_index_put(node: torch.fx.Node) -> str | None:
    if argument(node, 3, "accumulate", False):
        return "accumulate=True: 'index_put with accumulate=True is not supported'"
    source, values = value(node.args[0]), value(node.args[2])
    indices = [None if index is None else value(index) for index in node.args[1]]
    if not isinstance(source, torch.Tensor) or not isinstance(values, torch.Tensor):
        return None
    try:
        indexed = source[tuple(slice(None) if index is None else index for index in indices)]
    except Exception:  # noqa: BLE001 - an index the fake tensors cannot apply: judge nothing here
        return None
    if not _same_shape(values.shape, indexed.shape):
        return (
            f"values of shape {list(values.shape)} broadcast over indexed rows of shape {list(indexed.shape)}: "
            "the converter scatters them without the broadcast"
        )
    return None


def _same_shape(a: torch.Size, b: torch.Size) -> bool:
    """Whether two shapes are known equal: without a guard, so a data-dependent size (a boolean mask's count) that
    cannot be shown equal is not (never a crash on an unbacked symbol)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b))


@refuses(torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default)
def symbolic_size_past_dim0(node: torch.fx.Node) -> str | None:
    for operand in (node, *node.all_input_nodes):
        val = value(operand)
        if isinstance(val, torch.Tensor) and any(not isinstance(size, int) for size in val.shape[1:]):
            return (
                f"{operand.name} has a symbolic size past dim 0 ({list(val.shape)}): 'index_put currently only "
                "supports dynamic batch dimension (dim 0)'"
            )
    return None
