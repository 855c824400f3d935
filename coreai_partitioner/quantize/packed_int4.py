"""int4 integers held two a byte, as the Core AI asset stores them, and the op a program unpacks them with.

A weight stored as ``int4`` keeps its integers bit-packed from the moment
they are made (:func:`pack`): value ``2k`` in the low nibble of byte ``k``,
value ``2k + 1`` in the high one, over the weight's elements in row-major
order.  That is coreai-torch's ``IntxTensor`` layout, so the converter embeds
these very bytes; a program never holds a byte per int4 value, nor a second,
packed copy of them.  Packing runs along the last dim, so a weight whose last
dim is odd (a 3x3 kernel's) keeps one int8 per value, and coreai-torch packs it.

A program reads the bytes through ``coreai_partitioner::unpack_int4``
(:data:`UNPACK_INT4`), which gives the int8 integers eagerly; the Core AI
backend folds it into the constant it reads (the backend's
``packed_int4_constants`` pass), so the delegate's graph is coreai-torch's own.
"""

from __future__ import annotations

import torch

from coreai_partitioner.backends.apple_coreai.passes import UNPACK_INT4 as OP_NAME  # the name the backend folds

__all__ = ["UNPACK_INT4", "is_packed", "pack", "packs", "unpack"]


def packs(shape: tuple[int, ...] | torch.Size) -> bool:
    """Whether int4 integers of ``shape`` are held packed: their last dim is even (a 3x3 kernel's rows are not)."""
    return shape[-1] % 2 == 0


def pack(data: torch.Tensor) -> torch.Tensor:
    """int8 ``data`` (values in [-8, 7]) whose last dim is even -> uint8 ``[..., last / 2]``."""
    if not packs(data.shape):
        raise ValueError(f"int4 data of shape {tuple(data.shape)} has an odd last dim: it is kept one value a byte")
    nibbles = (data & 0xF).to(torch.uint8)
    return nibbles[..., 0::2] | nibbles[..., 1::2] << 4


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """The int8 integers of ``packed`` (uint8 ``[..., n]``): ``[..., 2 n]``, each in [-8, 7]."""
    low = (packed & 0xF).to(torch.int8)
    high = (packed >> 4).to(torch.int8)
    pairs = torch.stack([low, high], dim=-1).flatten(-2)
    return torch.where(pairs > 7, pairs - 16, pairs)


def is_packed(data: torch.Tensor) -> bool:
    """Whether int4 ``data`` (an ``int`` form's ``quantized`` buffer) is bit-packed: uint8, where unpacked is int8."""
    return data.dtype == torch.uint8


@torch.library.custom_op(OP_NAME, mutates_args=())
def _unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    return unpack(packed)


@_unpack_int4.register_fake
def _(packed: torch.Tensor) -> torch.Tensor:
    return packed.new_empty((*packed.shape[:-1], 2 * packed.shape[-1]), dtype=torch.int8)


#: ``unpack_int4(packed) -> int8``: what a program reads a packed int4 weight's integers through.
UNPACK_INT4 = torch.ops.coreai_partitioner.unpack_int4.default
