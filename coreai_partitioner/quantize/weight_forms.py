"""How one weight is stored compressed, and the Core AI op that expands it.

A :class:`Form` is one way to store a weight, weight-only:

- ``int``: int8 or int4, symmetric, one scale per output channel or per block
  of ``size`` input channels; expanded by ``coreai::constexpr_blockwise_shift_scale``;
- ``lut`` (palettization): a look-up table of ``2 ** bits`` values per group of
  ``size`` output channels and an index per weight (:mod:`.kmeans`);
  expanded by ``coreai::lut_to_dense``.

coreai-torch converts both ops to Core AI's constexpr ops, so the asset keeps
the compressed bytes (``si8``/``si4`` data, ``ui4``/``ui8`` indices) and the
device expands them.  :func:`compress` makes a weight's :class:`Compressed`
buffers; :meth:`Compressed.call` is the op and its operands, for a module's
``forward`` or a graph node.

A weight's axes: every dim before ``axis`` is a batch (an expert: its own
tables or scales), ``axis`` holds the output channels, the last dim the input
channels.  A Linear's ``[out, in]`` and an embedding's ``[vocab, width]``
have ``axis`` 0 (an embedding's rows are the tied lm_head's output channels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner import _compat
from coreai_partitioner.quantize.kmeans import cluster_rows

#: The op that expands an int8/int4 weight with its scales on device.
DECOMPRESS_OP = "constexpr_blockwise_shift_scale"
#: The op that expands a palettized weight on device.
LUT_OP = "lut_to_dense"

__all__ = ["Compressed", "Form", "compress"]

#: Bits each form takes.
BITS = {"int": (4, 8), "lut": (4, 8)}


@dataclass(frozen=True)
class Form:
    """``kind`` ``"int"`` or ``"lut"``, ``bits``, and ``size``: input channels per scale (``int``; ``None`` is one
    scale per output channel) or output channels per look-up table (``lut``)."""

    kind: str
    bits: int
    size: int | None = None

    def __post_init__(self) -> None:
        if self.bits not in BITS.get(self.kind, ()):
            raise ValueError(f"no {self.bits}-bit {self.kind!r} form; forms: " + ", ".join(f"{k} {b}" for k, b in BITS.items()))
        if self.kind == "lut" and not self.size or self.size is not None and self.size < 1:
            raise ValueError(f"a {self.kind} form needs a positive size (got {self.size})")

    def __str__(self) -> str:
        if self.kind == "lut":
            return f"{self.bits}-bit look-up tables, one per {self.size} output channels"
        return f"int{self.bits} per output channel" if self.size is None else f"int{self.bits} in blocks of {self.size} input channels"

    def misfit(self, shape: tuple[int, ...] | torch.Size, axis: int = 0) -> str | None:
        """Why a weight of ``shape`` cannot take this form, or ``None``."""
        if len(shape) < axis + 2:
            return f"it has {len(shape)} dimension(s), and {self} needs output and input channels"
        if self.kind == "lut" and shape[axis] % self.size:
            return f"its {shape[axis]} output channels are not a multiple of {self.size}"
        if self.kind == "int" and self.size is not None and shape[-1] % self.size:
            return f"its {shape[-1]} input channels are not a multiple of {self.size}"
        return None

    def stored_bits(self, shape: tuple[int, ...] | torch.Size, axis: int = 0, float_bits: int = 16) -> int:
        """Bits the asset stores for a weight of ``shape``: data or indices, and scales or tables in ``float_bits``."""
        numel = math.prod(shape)
        if self.kind == "lut":
            tables = math.prod(shape[: axis + 1]) // self.size
            return numel * self.bits + tables * (1 << self.bits) * float_bits
        scales = numel // shape[-1] * (1 if self.size is None else shape[-1] // self.size)
        return numel * self.bits + scales * float_bits


@dataclass(frozen=True)
class Compressed:
    """A weight as ``form`` stores it: ``buffers`` in the expanding op's operand order; for a look-up table,
    ``error`` is its squared error relative to the weight's (``|W - W'|^2 / |W|^2``)."""

    form: Form
    buffers: dict[str, torch.Tensor]
    error: float | None = None

    def call(self, operands: tuple[Any, ...] | None = None) -> tuple[Any, tuple[Any, ...]]:
        """``(op, args)`` that expand the weight from ``operands`` (the buffers, or what stands for them in a graph)."""
        ops = _compat.compression_ops()
        first, second = operands if operands is not None else tuple(self.buffers.values())
        if self.form.kind == "lut":
            return ops.lut_to_dense.default, (first, second, 0)
        bits = torch.int4 if self.form.bits == 4 else torch.int8
        return ops.constexpr_blockwise_shift_scale.default, (first, second, None, None, bits)

    def expand(self) -> torch.Tensor:
        """The weight as the device sees it."""
        op, args = self.call()
        return op(*args)

    def transpose(self, a: int, b: int) -> Compressed:
        """The same weight with dims ``a`` and ``b`` swapped (a table's leading dims follow the weight's)."""
        buffers = {name: t.transpose(a, b).contiguous() for name, t in self.buffers.items()}
        return Compressed(self.form, buffers, self.error)


@torch.no_grad()
def compress(weight: torch.Tensor, form: Form, *, axis: int = 0) -> Compressed:
    """``weight`` stored as ``form`` (see the module docstring for ``axis``); scales and tables in its dtype.

    Raises ``ValueError`` for a shape the form does not fit (:meth:`Form.misfit`)
    or a weight that is not finite; callers check both first and name the layer.
    """
    reason = form.misfit(weight.shape, axis)
    if reason is not None:
        raise ValueError(f"a weight of shape {tuple(weight.shape)} cannot be stored as {form}: {reason}")
    if not bool(torch.isfinite(weight).all()):
        raise ValueError("the weight has NaN or infinite values, which no table or scale can hold")
    if form.kind == "int":
        data, scale = _integers(weight, form, axis)
        return Compressed(form, {"quantized": data, "scale": scale.to(weight.dtype)})
    shape = weight.shape
    rows = weight.reshape(math.prod(shape[: axis + 1]), -1)
    indices, centroids, error = cluster_rows(rows, form.bits, form.size)
    tables = [*shape[:axis], shape[axis] // form.size, *[1] * (len(shape) - axis - 1), 1 << form.bits, 1]
    return Compressed(form, {"indices": indices.view(shape), "lut": centroids.to(weight.dtype).view(tables)}, error)


def _integers(weight: torch.Tensor, form: Form, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(int8 data, scale)``, symmetric: values in ``[-2 ** (bits - 1), 2 ** (bits - 1) - 1]``; ``scale`` has the weight's rank."""
    levels = (1 << (form.bits - 1)) - 1
    w = weight.float()
    if form.size is None:
        amax = w.abs().amax(dim=tuple(range(axis + 1, w.dim())), keepdim=True)
        expand = lambda scale: scale  # noqa: E731 - broadcasts
    else:
        blocks = w.unflatten(-1, (w.shape[-1] // form.size, form.size))
        amax = blocks.abs().amax(dim=-1)
        expand = lambda scale: scale.repeat_interleave(form.size, dim=-1)  # noqa: E731
    scale = (amax / levels).clamp(min=torch.finfo(torch.float32).tiny)
    data = torch.clamp(torch.round(w / expand(scale)), -levels - 1, levels).to(torch.int8)
    return data, scale
