"""Int8 KV caches: keys and values stored as int8 with a scale per token and head, dequantized before SDPA.

A layer's caches become four buffers (:func:`quantize_kv_caches`):
``key_cache`` and ``value_cache`` int8 ``[B, H, L, D]``, ``key_scale_cache``
and ``value_scale_cache`` ``[B, H, L, 1]`` in the model's dtype.  A call's
rows are quantized as they are computed (:func:`quantize_rows`: symmetric,
``scale = max |x| / 127`` over the head's ``D`` values of one token, the
scheme of ExecuTorch's ``QuantizedKVCache`` without its zero point), written
to their slots, and the cache is dequantized (``int8 * scale``) just before
the SDPA composite.  What is kept between calls is the int8 cache and its
scales: ``(D + s) / (2 D)`` of an fp16 cache's bytes, ``s`` the scale's
bytes (0.516 for ``D = 64`` with fp16 scales).  A step's own rows are
attended as they will be read later (quantized and dequantized), so a prefill
and the same tokens one at a time see the same keys.

Recurrent state (gated delta rules, short convolutions) is not a KV cache
and stays in the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

#: The cache layouts a decoder's attention caches may be stored in.
KV_CACHES = ("fp", "int8")

#: The largest magnitude a symmetric int8 value takes (-127..127: -128 is never written).
INT8_MAX = 127.0


@dataclass(frozen=True)
class QuantizedKV:
    """One layer's int8 caches and their scales (the :class:`~.attention.Attention`'s buffers themselves)."""

    keys: torch.Tensor  # [B, H, L, D] int8
    key_scales: torch.Tensor  # [B, H, L, 1], the model's dtype
    values: torch.Tensor
    value_scales: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the cache is dequantized to (its scales')."""
        return self.key_scales.dtype


def quantize_rows(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``states`` [B, H, T, D] as int8 values (held in ``states``' float dtype, integers in -127..127) and their
    scale per token and head ``[B, H, T, 1]``: ``states ≈ values * scale``.

    The values stay float here: inside the delegate they are written into the
    cache as float (a one-hot product) and cast to int8 where they are stored.
    An all-zero row gets a tiny scale, not zero (no division by zero).
    """
    amax = states.abs().amax(dim=-1, keepdim=True)
    tiny = torch.finfo(states.dtype).tiny if states.dtype != torch.float16 else 6.1e-5
    scale = torch.clamp(amax, min=tiny) / INT8_MAX
    values = torch.clamp(torch.round(states / scale), -INT8_MAX, INT8_MAX)
    return values, scale


def quantized(attention: nn.Module) -> QuantizedKV | None:
    """``attention``'s int8 caches, or ``None`` when its caches are float (or it has none)."""
    if getattr(attention, "key_scale_cache", None) is None:
        return None
    return QuantizedKV(attention.key_cache, attention.key_scale_cache, attention.value_cache, attention.value_scale_cache)


def quantize_kv_caches(decoder: nn.Module, kv_cache: str = "int8") -> nn.Module:
    """Store every KV cache of ``decoder`` as ``kv_cache`` says (``"fp"``: as built; ``"int8"``: int8 and a scale per
    token and head, in the caches' dtype); returns ``decoder``.  Recurrent states are left as they are."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache {kv_cache!r}: choose one of {', '.join(KV_CACHES)}")
    if kv_cache == "fp":
        return decoder
    for module in decoder.modules():
        if not _owns_kv_cache(module) or quantized(module) is not None:
            continue
        dtype, shape = module.key_cache.dtype, module.key_cache.shape
        for name in ("key", "value"):
            module.register_buffer(f"{name}_cache", torch.zeros(shape, dtype=torch.int8), persistent=False)
            module.register_buffer(f"{name}_scale_cache", torch.zeros(*shape[:-1], 1, dtype=dtype), persistent=False)
    return decoder


def kv_cache_bytes(decoder: nn.Module) -> int:
    """The bytes of ``decoder``'s KV caches (their scales included), not its recurrent states."""
    total = 0
    for module in decoder.modules():
        if _owns_kv_cache(module):
            names = ("key_cache", "value_cache", "key_scale_cache", "value_scale_cache")
            total += sum(b.numel() * b.element_size() for b in (getattr(module, n, None) for n in names) if b is not None)
    return total


def _owns_kv_cache(module: nn.Module) -> bool:
    """Whether ``module`` is an attention layer keeping a KV cache of its own (:class:`~.attention.Attention`'s
    ``owns_cache``; this module is what that one imports)."""
    return bool(getattr(module, "owns_cache", False)) and isinstance(getattr(module, "key_cache", None), torch.Tensor)
