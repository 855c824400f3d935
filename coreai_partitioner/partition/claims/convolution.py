"""Rules for convolutions (``aten.convolution``: 1-d to 3-d, plain and transposed).

coreai-torch's ``replace_conv`` raises on what it does not lower; each rule
here is one of its ``ValueError`` s, so the node runs on the portable
kernels instead of killing the lowering.
"""

from __future__ import annotations

import torch

from coreai_partitioner.partition.claims import argument, refuses, value


@refuses(torch.ops.aten.convolution.default)
def unsupported_convolution(node: torch.fx.Node) -> str | None:
    source = value(node.args[0])
    rank = source.dim() if isinstance(source, torch.Tensor) else None
    stride, dilation = argument(node, 3, "stride", [1]), argument(node, 5, "dilation", [1])
    transposed, output_padding = bool(argument(node, 6, "transposed", False)), argument(node, 7, "output_padding", [0])
    if rank not in (3, 4, 5):
        return f"a rank-{rank} input: the converter lowers conv1d, conv2d and conv3d only"
    if transposed and rank == 5:
        return "a transposed 3-d convolution: 'Transposed conv3d is not yet supported'"
    if transposed and any(op >= s and op >= d for op, s, d in zip(output_padding, stride, dilation)):
        return f"output_padding={list(output_padding)} not smaller than stride or dilation: the converter refuses it"
    if not transposed and any(output_padding):
        return f"output_padding={list(output_padding)} on a convolution that is not transposed: the converter refuses it"
    return None
