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

import contextlib
import contextvars
import operator
from collections.abc import Callable, Iterator
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


#: what one partitioning has judged so far (:func:`judging`), by kind: node -> reason, node -> its rank-0 region's
#: nodes kept outside (:mod:`.scalar_results`)
_JUDGED: contextvars.ContextVar[dict[str, dict] | None] = contextvars.ContextVar("judged", default=None)


@contextlib.contextmanager
def judging() -> Iterator[None]:
    """Judge each node once within: the partitioner asks of every node, and the rank-0 rules ask of a node's
    neighbours and of its whole region, so without it a region is analysed once per node of it.  For one
    partitioning of a graph that does not change meanwhile."""
    token = _JUDGED.set({})
    try:
        yield
    finally:
        _JUDGED.reset(token)


def judged(kind: str) -> dict | None:
    """The table of what :func:`judging` remembers of ``kind`` (``None`` outside it: judge afresh)."""
    tables = _JUDGED.get()
    return None if tables is None else tables.setdefault(kind, {})


def refusal(node: torch.fx.Node) -> str | None:
    """Why the converter cannot lower ``node`` right (``None``: nothing against it here)."""
    return _remembered("refusal", node, lambda: _first_reason(node, (*_own_rules(node), *_RULES.get(EVERY_OP, ()))))


def own_refusal(node: torch.fx.Node) -> str | None:
    """Why a rule of ``node``'s own op keeps it outside, the rules of every op left out (``None``: none does)."""
    return _remembered("own refusal", node, lambda: _first_reason(node, _own_rules(node)))


def _remembered(kind: str, node: torch.fx.Node, judge: Callable[[], "str | None"]) -> str | None:
    table = judged(kind)
    if table is None:
        return judge()
    if node not in table:
        table[node] = judge()
    return table[node]


def _own_rules(node: torch.fx.Node) -> list[Rule]:
    return _RULES.get(_compat.converted_op(node.target), []) if node.op == "call_function" else []


def _first_reason(node: torch.fx.Node, rules: Any) -> str | None:
    if node.op != "call_function":
        return None
    for rule in rules:
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
