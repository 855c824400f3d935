"""A pass over an exported decoder: :func:`remove_noop_expands`.

It keeps an exported dim enumerable down to 1 (an LLM's ``T`` in {1,
chunk}): it drops the ``expand`` calls that specialize wrongly in Core AI
(coreai-core 1.0.0b3).
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule

from coreai_partitioner import _compat

def remove_noop_expands(graph_module: GraphModule) -> int:
    """Drop ``expand`` calls whose result has their input's shape; returns how many.

    ``torch.matmul``'s decomposition expands each operand to the shape it
    already has.  Converted, that is a ``coreai.broadcast_to`` to a shape read
    at run time, which coreai-core 1.0.0b3 folds to a value of another type
    when an enumerated shape makes a dim 1 ("incorrect fold result type", an
    abort).  The expand computes nothing, so it goes.
    """
    removed = 0
    for node in list(graph_module.graph.nodes):
        if node.op != "call_function" or _compat.aten_op(node.target) not in _EXPANDS:
            continue
        source = node.args[0]
        if _same_shape(_val(source), node.meta.get("val")):
            node.replace_all_uses_with(source)
            graph_module.graph.erase_node(node)
            removed += 1
    if removed:
        graph_module.recompile()
    return removed


_EXPANDS = (torch.ops.aten.expand.default, torch.ops.aten.expand_copy.default)


def _same_shape(a, b) -> bool:
    """Equal shapes, compared symbol by symbol (no guard on the shape environment)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dim() != b.dim():
        return False
    return all(_compat.sym_expr(x) == _compat.sym_expr(y) for x, y in zip(a.shape, b.shape))


def _val(arg):
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
