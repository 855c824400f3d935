"""What the converter lowers, per op and its arguments: a node the partitioner must not claim says why.

coreai-torch's lowering tables say which op *targets* the converter knows;
they do not say which *arguments* it handles.  A node claimed on its target
alone can kill the whole lowering (``avg_pool2d`` with ``ceil_mode``), or
lower to a silently wrong program (``add`` with ``alpha``).  Each module here
holds the rules for one family of ops, in the way XNNPACK's
``partition/config/`` holds one class per op: a rule is a function from a
node to the reason it stays outside (``None`` when the converter lowers it
right), registered with :func:`refuses` for the ATen ops it judges.  What is
not claimed runs on ExecuTorch's portable kernels.

:func:`refusal` is what :class:`~coreai_partitioner.partition.op_support.OperatorSupport`
asks.  ``docs/lowering-any-model.md`` lists each rule with the converter's
error or the wrong result it prevents.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from coreai_partitioner import _compat

Rule = Callable[[torch.fx.Node], "str | None"]

_RULES: dict[Any, list[Rule]] = {}

#: the key of the rules that judge a node of any op (a rank-0 operand from outside: ``scalars.py``)
EVERY_OP = "every op"


def refuses(*ops: Any) -> Callable[[Rule], Rule]:
    """Register a rule for ``ops`` (ATen overloads); it returns why a node stays outside, or ``None``."""

    def register(rule: Rule) -> Rule:
        for op in ops:
            _RULES.setdefault(op, []).append(rule)
        return rule

    return register


def refusal(node: torch.fx.Node) -> str | None:
    """Why the converter cannot lower ``node`` right (``None``: nothing against it here)."""
    if node.op != "call_function":
        return None
    for rule in (*_RULES.get(_compat.converted_op(node.target), ()), *_RULES.get(EVERY_OP, ())):
        reason = rule(node)
        if reason is not None:
            return reason
    return None


def argument(node: torch.fx.Node, index: int, name: str, default: Any) -> Any:
    """The value of ``node``'s argument ``name`` (position ``index`` in the schema), or its default."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def value(node: Any) -> Any:
    """A node's ``meta["val"]`` (a fake tensor, a tuple of them, or a scalar); a constant as it is."""
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


# The rule modules register themselves on import.
from coreai_partitioner.partition.claims import (  # noqa: E402,F401
    arithmetic, convolution, indexing, pooling, reductions, scalar_results, scalars, shapes, upsampling,
)
