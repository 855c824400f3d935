"""Rules for elementwise arithmetic."""

from __future__ import annotations

import torch

from coreai_partitioner.partition.claims import argument, refuses, value


@refuses(torch.ops.aten.add.Tensor, torch.ops.aten.sub.Tensor, torch.ops.aten.add.Scalar, torch.ops.aten.sub.Scalar)
def scaled_operand(node: torch.fx.Node) -> str | None:
    # coreai-torch lowers add/sub to coreai.add/sub and drops alpha: x + 2*y comes out as x + y.
    alpha = argument(node, 2, "alpha", 1)
    return None if alpha == 1 else f"the converter drops alpha={alpha} (it computes x + y)"


@refuses(torch.ops.aten.mul.Tensor, torch.ops.aten.mul.Scalar)
def boolean_product(node: torch.fx.Node) -> str | None:
    # coreai-torch lowers it to coreai.mul, which coreai-core's runtime has no bool kernel for.
    result = value(node)
    if isinstance(result, torch.Tensor) and result.dtype == torch.bool:
        return "a bool product: the converter makes it coreai.mul, which the Core AI runtime has no bool kernel for"
    return None
