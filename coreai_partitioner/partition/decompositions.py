"""Decompositions of ops coreai-torch has no lowering for into ops it has, for :func:`~coreai_partitioner.lowering.whole_program.decomposition_table`.

ExecuTorch's default table turns a one-dimensional interpolation
(``F.interpolate`` on ``[N, C, L]``: ``upsample_nearest1d``,
``upsample_linear1d``) into index arithmetic and an int64 ``index`` the
delegate cannot take, so each one split a program (Kokoro's vocoder, which
upsamples its F0 curve and its residual blocks so).  coreai-torch lowers the
two-dimensional ops; a one-dimensional interpolation is one of them over a
height of 1 (scale 1: each output row is its one input row, weighted by 1).
``remainder.Scalar`` (``x % 1``) becomes ``remainder.Tensor``, the overload
coreai-torch lowers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

aten = torch.ops.aten


def _rows(sizes: Sequence[int] | None) -> list[int] | None:
    return None if sizes is None else [1, *sizes]


def _scales(scales: Sequence[float] | None) -> list[float] | None:
    return None if scales is None else [1.0, *scales]


def nearest1d_vec(x: torch.Tensor, output_size: Sequence[int] | None, scale_factors: Sequence[float] | None):
    return aten.upsample_nearest2d.vec(x.unsqueeze(2), _rows(output_size), _scales(scale_factors)).squeeze(2)


def nearest1d(x: torch.Tensor, output_size: Sequence[int], scales: float | None = None):
    return nearest1d_vec(x, output_size if scales is None else None, None if scales is None else [scales])


def linear1d_vec(x: torch.Tensor, output_size, align_corners: bool, scale_factors):
    return aten.upsample_bilinear2d.vec(x.unsqueeze(2), _rows(output_size), align_corners, _scales(scale_factors)).squeeze(2)


def linear1d(x: torch.Tensor, output_size: Sequence[int], align_corners: bool, scales: float | None = None):
    return linear1d_vec(x, output_size if scales is None else None, align_corners, None if scales is None else [scales])


def remainder_scalar(x: torch.Tensor, other) -> torch.Tensor:
    return aten.remainder.Tensor(x, torch.scalar_tensor(other, dtype=x.dtype))


#: What :func:`~coreai_partitioner.lowering.whole_program.decomposition_table` decomposes so, over ExecuTorch's default.
DECOMPOSITIONS = {
    aten.upsample_nearest1d.vec: nearest1d_vec,
    aten.upsample_nearest1d.default: nearest1d,
    aten.upsample_linear1d.vec: linear1d_vec,
    aten.upsample_linear1d.default: linear1d,
    aten.remainder.Scalar: remainder_scalar,
}


def coreai_table() -> dict:
    """coreai-torch's decomposition table (``get_decomp_table()``) and :data:`DECOMPOSITIONS`."""
    from coreai_torch import get_decomp_table

    return {**get_decomp_table(), **DECOMPOSITIONS}
