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

import operator
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


def is_rank0(val: Any) -> bool:
    """Whether ``val`` (a node's :func:`value`) is a rank-0 tensor."""
    return isinstance(val, torch.Tensor) and val.dim() == 0


#: the kind of placeholder (its ``meta["desc"]``, set by ``torch.export``) the program is called with; the others
#: (parameters, buffers, constants, and the constants lifted after export, which have no ``desc``) are data the
#: delegate takes over
_PROGRAM_INPUT = "PlainAOTInput"


def left_outside(node: torch.fx.Node, refused: Callable[[torch.fx.Node], bool]) -> bool:
    """Whether ``node``'s value reaches a delegate from outside it: a program input, a 64-bit result (upstream leaves
    them outside), a result of an op the converter does not know, or of a node ``refused`` keeps outside (the rank-0
    rules each ask their own question there: :mod:`.scalars`, :mod:`.scalar_results`)."""
    if node.op == "placeholder":
        return type(node.meta.get("desc")).__name__ == _PROGRAM_INPUT
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return left_outside(node.args[0], refused)
    result = value(node)
    parts = result if isinstance(result, (tuple, list)) else (result,)  # max.dim: values beside int64 indices
    if any(isinstance(part, torch.Tensor) and part.dtype in (torch.int64, torch.float64) for part in parts):
        return True
    return not _compat.is_coreai_supported_target(node.target) or refused(node)


# The rule modules register themselves on import.
from coreai_partitioner.partition.claims import (  # noqa: E402,F401
    arithmetic, convolution, data_dependent, indexing, pooling, reductions, scalar_results, scalars, shapes, upsampling,
)
