"""Rules for shape ops.

``aten.squeeze.dims`` is a no-op on a dim whose size is not 1; coreai-torch
lowers it to ``coreai.shrink_dims`` of every listed dim, which fails
("Operation creation failed") on such a dim.
"""

from __future__ import annotations

import torch

from coreai_partitioner.partition.claims import argument, refuses, value


@refuses(torch.ops.aten.squeeze.dims, torch.ops.aten.squeeze.dim)
def squeezes_a_dim_not_of_size_one(node: torch.fx.Node) -> str | None:
    source = value(node.args[0])
    if not isinstance(source, torch.Tensor):
        return None
    dims = argument(node, 1, "dim", [])
    dims = [dims] if isinstance(dims, int) else list(dims)
    if source.dim() == 0:
        return "a rank-0 input: the converter shrinks dims it does not have"
    sizes = [source.shape[d] for d in dims]
    if any(size != 1 for size in sizes):
        return f"dims {dims} of sizes {sizes}: PyTorch leaves a dim not of size 1, the converter's shrink_dims fails on it"
    return None
