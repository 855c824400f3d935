"""Rules for pooling (``avg_pool2d``/``avg_pool3d``, ``max_pool2d_with_indices``; 1-d pools reach them unsqueezed).

coreai-torch (0.4.3) lowers average pooling as zero padding, a sum pool and a
division by the whole window (or ``divisor_override``), with the output size
computed by floor: ``ceil_mode`` and ``count_include_pad=False`` are not
honoured (its own comment: "generates the body of the composite as if
count_include_pad = True and ceil_mode = False at all times").  Max pooling
pads with -inf and sizes its output by ``floor`` or ``ceil`` without
PyTorch's rule that a window must start inside the input, and returns zeros
for the indices.  Each rule keeps the node outside where the converter's
output would differ from PyTorch's.  The arguments coreai-torch reads by
position and dies on (a stride of ``[]``, ``ceil_mode`` without
``count_include_pad``) are written out before it converts
(``backends/apple_coreai/passes.py``'s ``pool_arguments_in_full``).  At a
symbolic spatial size only ``ceil_mode`` needs the static size: by floor,
PyTorch's output size is the converter's at any size.
"""

from __future__ import annotations

import math

import torch

from coreai_partitioner.partition.claims import argument, refuses, value


def _windows(node: torch.fx.Node, spatial: int, default_padding: int = 0) -> tuple | str:
    """``(kernel, stride, padding)``, one value per spatial dim, or why the converter cannot read them."""
    kernel = list(argument(node, 1, "kernel_size", []))
    stride = list(argument(node, 2, "stride", []) or kernel)
    padding = list(argument(node, 3, "padding", [default_padding] * spatial))
    for name, values in (("kernel_size", kernel), ("stride", stride), ("padding", padding)):
        if len(values) != spatial or not all(isinstance(v, int) for v in values):
            return f"{name}={values}: the converter reads {spatial} static values"
    return kernel, stride, padding


def _spatial_shape(node: torch.fx.Node, spatial: int) -> tuple | None:
    """The input's and the output's spatial sizes, or None where one is symbolic (known when the program runs)."""
    source, result = value(node.args[0]), value(node)
    if isinstance(result, (tuple, list)):
        result = result[0]
    if not isinstance(source, torch.Tensor) or not isinstance(result, torch.Tensor):
        return None
    sizes = tuple(source.shape[-spatial:]) + tuple(result.shape[-spatial:])
    return sizes if all(isinstance(s, int) for s in sizes) else None


#: why ``ceil_mode`` needs the static size (XNNPACK too refuses ``ceil_mode`` only, under dynamic shapes)
_CEIL_AT_SYMBOLIC_SIZE = (
    "ceil_mode=True at a symbolic spatial size: whether it adds a window PyTorch's rules keep or drop is known only "
    "when the program runs"
)


@refuses(torch.ops.aten.avg_pool2d.default, torch.ops.aten.avg_pool3d.default)
def average_pool(node: torch.fx.Node) -> str | None:
    spatial = 2 if "avg_pool2d" in str(node.target) else 3
    windows = _windows(node, spatial)
    if isinstance(windows, str):
        return windows
    kernel, stride, padding = windows
    ceil_mode = bool(argument(node, 4, "ceil_mode", False))
    count_include_pad = bool(argument(node, 5, "count_include_pad", True))
    shapes = _spatial_shape(node, spatial)
    if ceil_mode and shapes is None:
        return _CEIL_AT_SYMBOLIC_SIZE
    if ceil_mode:
        sizes, pooled = shapes[:spatial], shapes[spatial:]
        floor = tuple((size + 2 * p - k) // s + 1 for size, k, s, p in zip(sizes, kernel, stride, padding))
        if floor != pooled:
            return f"ceil_mode=True makes the output {list(pooled)}, the converter sizes it by floor ({list(floor)})"
    if not count_include_pad and any(padding) and argument(node, 6, "divisor_override", None) is None:
        return "count_include_pad=False with padding: the converter divides every window by its full size"
    return None


@refuses(torch.ops.aten.max_pool2d_with_indices.default)
def max_pool(node: torch.fx.Node) -> str | None:
    windows = _windows(node, 2)
    if isinstance(windows, str):
        return windows
    kernel, stride, padding = windows
    dilation = list(argument(node, 4, "dilation", [1, 1]))
    ceil_mode = bool(argument(node, 5, "ceil_mode", False))
    shapes = _spatial_shape(node, 2)
    if ceil_mode and shapes is None:
        return _CEIL_AT_SYMBOLIC_SIZE
    if shapes is not None:  # by floor, PyTorch's size is the converter's at any size
        rounding = math.ceil if ceil_mode else math.floor
        converter = tuple(
            int(rounding((size + 2 * p - d * (k - 1) - 1) / s)) + 1
            for size, k, s, p, d in zip(shapes[:2], kernel, stride, padding, dilation)
        )
        if converter != shapes[2:]:
            return f"the output is {list(shapes[2:])}, the converter sizes it {list(converter)} (ceil_mode={ceil_mode})"
    indices = [user for user in node.users if user.args[1:] == (1,)]
    if any(user.users for user in indices):
        return "its indices are read: the converter returns zeros for them"
    return None
