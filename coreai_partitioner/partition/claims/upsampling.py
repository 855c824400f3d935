"""Rules for upsampling (``upsample_nearest2d.vec``, the overload coreai-torch lowers).

coreai-torch lowers ``upsample_nearest2d`` to ``coreai.interpolate`` in
``nearest_neighbor`` mode, which picks the source pixel nearest to the
half-pixel centre, ``(dst + 0.5) / scale - 0.5``, rounding a tie down;
PyTorch's ``nearest`` picks ``floor(dst / scale)``.  The two agree for every
pixel when the scale is a whole number (an output size that is a whole
multiple of the input's, or a whole scale factor); at a scale of a half
(1.5) they agree only where a float tie rounds down, and elsewhere (7 to 10
pixels) a silently shifted pixel comes out.  So only a whole scale is
claimed; at a symbolic size, one the sizes show whole (``2 * s0`` from ``s0``).
"""

from __future__ import annotations

import torch

import sympy

from coreai_partitioner import _compat
from coreai_partitioner.partition.claims import argument, refuses, value


@refuses(torch.ops.aten.upsample_nearest2d.vec)
def fractional_nearest_scale(node: torch.fx.Node) -> str | None:
    scale_factors = argument(node, 2, "scale_factors", None)
    if scale_factors is not None:
        if all(float(factor).is_integer() for factor in scale_factors):
            return None
        return (
            f"scale_factor={list(scale_factors)}: the converter picks the pixel nearest (dst + 0.5) / scale - 0.5, "
            "PyTorch's 'nearest' floor(dst / scale); they agree at a whole scale factor only"
        )
    source, result = value(node.args[0]), value(node)
    if not isinstance(source, torch.Tensor) or not isinstance(result, torch.Tensor):
        return None
    sizes, upsampled = tuple(source.shape[-2:]), tuple(result.shape[-2:])
    whole = [_whole_scale(size, out) for size, out in zip(sizes, upsampled)]
    if all(whole):
        return None
    if None in whole:
        return (
            f"size {list(upsampled)} from {list(sizes)}: a scale known only when the program runs, and the converter's "
            "nearest pixel is PyTorch's only at a whole scale"
        )
    return (
        f"size {list(upsampled)} from {list(sizes)}: the converter picks the pixel nearest (dst + 0.5) / scale - 0.5, "
        "PyTorch's 'nearest' floor(dst / scale); they agree when the size is a whole multiple of the input's"
    )


def _whole_scale(size, out) -> bool | None:
    """Whether ``out`` is a whole multiple of ``size``; None when a symbolic size leaves it unknown (``2 * s0`` from
    ``s0`` is whole)."""
    if isinstance(size, int) and isinstance(out, int):
        return size > 0 and out % size == 0
    ratio = sympy.sympify(_compat.sym_expr(out)) / sympy.sympify(_compat.sym_expr(size))
    return True if ratio.is_Integer and ratio > 0 else None
