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

import torch

from coreai_partitioner.partition.claims import EVERY_OP, is_rank0, left_outside, refusal, refuses, value


@refuses(EVERY_OP)
def scalar_from_outside(node: torch.fx.Node) -> str | None:
    for operand in node.all_input_nodes:
        if is_rank0(value(operand)) and _outside(operand):
            return (
                f"it reads {operand.name}, a rank-0 tensor from outside the delegate: coreai-core 1.0.0b3's runtime "
                "traps (SIGILL) on a rank-0 delegate input; make it a 1-element tensor (reshape(1)) to keep it inside"
            )
    return None


def _outside(node: torch.fx.Node) -> bool:
    """Whether ``node``'s value reaches a delegate as a run-time input: a program input, or a result left outside."""
    return left_outside(node, lambda judged: refusal(judged) is not None)
