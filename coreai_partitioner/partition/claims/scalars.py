"""Rules for rank-0 tensors: none may enter a Core AI delegate from outside it.

coreai-core 1.0.0b3's runtime traps (SIGILL, a ``ud2`` in the runtime) when a
delegate is executed with a rank-0 tensor input: ``x * s`` with ``s`` a rank-0
program input, or with ``s = x.sum()`` left outside by ``reductions.py``; it
loads, then dies on ``execute``.  swin_v2_t met it through the ``16`` of
``16 * torch.sigmoid(bias)``, a lifted int64 constant whose int32 cast stayed
outside.  A rank-0 constant the delegate takes over with its data (a
parameter, a buffer, a lifted constant) is no input and lowers right.  So a
node that reads a rank-0 tensor a delegate would take as an input stays
outside with it, and so do its rank-0 results' readers, until a tensor of
rank >= 1 enters the delegate.
"""

from __future__ import annotations

import operator

import torch

from coreai_partitioner import _compat
from coreai_partitioner.partition.claims import EVERY_OP, refusal, refuses, value

#: the kind of placeholder (its ``meta["desc"]``, set by ``torch.export``) the program is called with; the others
#: (parameters, buffers, constants, and the constants lifted after export, which have no ``desc``) are data the
#: delegate takes over
_PROGRAM_INPUT = "PlainAOTInput"


@refuses(EVERY_OP)
def scalar_from_outside(node: torch.fx.Node) -> str | None:
    for operand in node.all_input_nodes:
        if _is_rank0(value(operand)) and _outside(operand):
            return (
                f"it reads {operand.name}, a rank-0 tensor from outside the delegate: coreai-core 1.0.0b3's runtime "
                "traps (SIGILL) on a rank-0 delegate input; make it a 1-element tensor (reshape(1)) to keep it inside"
            )
    return None


def _outside(node: torch.fx.Node) -> bool:
    """Whether ``node``'s value reaches a delegate as a run-time input: a program input, or a result left outside."""
    if node.op == "placeholder":
        return type(node.meta.get("desc")).__name__ == _PROGRAM_INPUT
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return _outside(node.args[0])
    result = value(node)
    parts = result if isinstance(result, (tuple, list)) else (result,)  # max.dim: values beside int64 indices
    if any(isinstance(part, torch.Tensor) and part.dtype in (torch.int64, torch.float64) for part in parts):
        return True  # upstream leaves 64-bit values outside
    return not _compat.is_coreai_supported_target(node.target) or refusal(node) is not None


def _is_rank0(val) -> bool:
    return isinstance(val, torch.Tensor) and val.dim() == 0
