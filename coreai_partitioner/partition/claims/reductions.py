"""Rules for reductions (``amax``, ``amin``, ``mean``, ``sum``...).

coreai-torch reads a reduction's dims as a list it indexes: ``amax``/``amin``
with no dim (``[]``: every dim) die with IndexError (or, with ``keepdim``, a
``coreai.reduce_max`` of an empty dims tensor the compiler rejects), and
``mean.dim`` with ``dim=None`` has no operand to read ("Unsupported arg type
<class 'NoneType'>").  A reduction to a rank-0 tensor lowers
right as long as the delegate does not hand it out (:mod:`.scalar_results`).
"""

from __future__ import annotations

import torch

from coreai_partitioner.partition.claims import argument, refuses


@refuses(torch.ops.aten.amax.default, torch.ops.aten.amin.default)
def every_dim_by_empty_list(node: torch.fx.Node) -> str | None:
    dims = argument(node, 1, "dim", [])
    if dims:
        return None
    return (
        "dim=[] (every dim): the converter passes the empty dims on (keepdim=False: IndexError 'tuple index out of "
        "range'; keepdim=True: 'coreai.reduce_max' op operand #1 must be 1D CoreAI Tensor of Index type)"
    )


@refuses(torch.ops.aten.mean.dim)
def mean_without_dims(node: torch.fx.Node) -> str | None:
    dims = argument(node, 1, "dim", None)
    return "dim=None: the converter reads the dims as an operand that is not there" if not dims else None
