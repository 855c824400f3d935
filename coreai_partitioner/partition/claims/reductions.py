"""Rules for reductions (``amax``, ``amin``, ``mean``, ``sum``...).

coreai-torch reads a reduction's dims as a list it indexes: ``amax``/``amin``
with no dim (``[]``: every dim) die with IndexError, ``mean.dim`` with
``dim=None`` has no operand to read.  A reduction to a rank-0 tensor comes back
from the Core AI runtime as rank 1 (``[1]``), which no runtime can resize into
the rank-0 output the program declares, so such a node stays outside.
"""

from __future__ import annotations

import torch

from coreai_partitioner.partition.claims import argument, refuses, value

_REDUCTIONS = (
    torch.ops.aten.amax.default, torch.ops.aten.amin.default, torch.ops.aten.mean.default, torch.ops.aten.mean.dim,
    torch.ops.aten.sum.default, torch.ops.aten.sum.dim_IntList, torch.ops.aten.max.default, torch.ops.aten.min.default,
    torch.ops.aten.prod.default, torch.ops.aten.prod.dim_int, torch.ops.aten.any.default, torch.ops.aten.any.dim,
    torch.ops.aten.any.dims, torch.ops.aten.all.default, torch.ops.aten.argmax.default, torch.ops.aten.argmin.default,
    torch.ops.aten.var.correction, torch.ops.aten.var.dim, torch.ops.aten.std.correction, torch.ops.aten.std.dim,
    torch.ops.aten.logsumexp.default,
)


@refuses(*_REDUCTIONS)
def reduces_to_a_scalar(node: torch.fx.Node) -> str | None:
    result = value(node)
    if isinstance(result, torch.Tensor) and result.dim() == 0:
        return "a rank-0 result: the Core AI runtime returns it as rank 1, which the program's output cannot take"
    return None


@refuses(torch.ops.aten.amax.default, torch.ops.aten.amin.default)
def every_dim_by_empty_list(node: torch.fx.Node) -> str | None:
    dims = argument(node, 1, "dim", [])
    return "dim=[] (every dim): the converter indexes the dims it is given (IndexError)" if not dims else None


@refuses(torch.ops.aten.mean.dim)
def mean_without_dims(node: torch.fx.Node) -> str | None:
    dims = argument(node, 1, "dim", None)
    return "dim=None: the converter reads the dims as an operand that is not there" if not dims else None
