"""Attention over a static cache the module owns, through the ``rope`` and SDPA composites."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from coreai_torch.composite_ops import SDPA, RoPE
from torch import nn

from coreai_partitioner.blocks.quantized_cache import quantized


@dataclass(frozen=True)
class AttentionShape:
    heads: int
    kv_heads: int
    head_dim: int


class Attention(nn.Module):
    """HF attention over a static cache the module owns, through the ``rope`` and SDPA composites.

    ``q``, ``k``, ``v`` and ``o`` are the HF projections; ``q_norm`` /
    ``k_norm`` norm each head before RoPE.  ``rope`` names the decoder's
    :class:`~.rope.RopeTable` (``None``: no RoPE, SmolLM3's NoPE layers) and
    ``rope_dims`` a partial rotation.  ``window`` makes a sliding layer (a
    ring of ``window`` slots and ``spare`` more, :func:`~.cache.window_plan`).  The step decides
    how the cache is read and written (:meth:`~.step.Step.full_cache`).

    A call is :meth:`project` (the projections), :meth:`query` and
    :meth:`keys_values` (heads, norms, RoPE, the cache), :meth:`attend` (the
    SDPA composite) and ``o``.  A family whose attention differs subclasses
    this in its own file and overrides the step that differs: fused
    projections (Phi-3), an output gate (Qwen3-Next), soft-capped logits
    (Gemma 2), attention sinks (GPT-OSS), a query scale by position
    (Ministral 3), keys shared between layers (Gemma 4).
    """

    #: Whether the layer keeps a KV cache of its own (a layer attending another's keys has none).
    owns_cache = True
    #: Whether the layer attends keys another layer of the same call left in the step: a graph break
    #: between the two would pass their mask between delegates.
    borrows_keys = False

    def __init__(
        self,
        path: str,
        shape: AttentionShape,
        *,
        q: nn.Module | None,
        k: nn.Module | None,
        v: nn.Module | None,
        o: nn.Module,
        context: int,
        dtype: torch.dtype,
        scale: float,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        rope: str | None = "default",
        rope_dims: int | None = None,
        window: int | None = None,
        spare: int = 0,
    ) -> None:
        super().__init__()
        self.path = path
        self.shape = shape
        self.q, self.k, self.v, self.o = q, k, v, o
        self.q_norm, self.k_norm = q_norm, k_norm
        self.rope_table = rope
        self.rotary = RoPE(dims=rope_dims) if rope is not None else None
        self.scale = float(scale)
        self.window = window if window is not None and window < context else None
        #: A sliding layer's ring: its window and ``spare`` slots more (a verify call's drafts), at most the context.
        self.ring = min(self.window + spare, context) if self.window is not None else None
        self.sdpa = SDPA(scale=self.scale, is_causal=True, window_size=self.window or 0)
        if self.owns_cache:
            cache_shape = (1, shape.kv_heads, self.ring or context, shape.head_dim)
            self.register_buffer("key_cache", torch.zeros(cache_shape, dtype=dtype), persistent=False)
            self.register_buffer("value_cache", torch.zeros(cache_shape, dtype=dtype), persistent=False)

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        q, k, v = self.project(x)
        return self.o(self.attend_heads(q, k, v, step))

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The query, key and value projections of ``x``, ``[B, T, width]`` each."""
        return self.q(x), self.k(x), self.v(x)

    def attend_heads(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, step) -> torch.Tensor:
        """Attention of the projections ``q``, ``k``, ``v`` ``[B, T, width]``; ``[B, T, heads * head_dim]``."""
        q = self.query(q, step)
        keys, values, mask = self.keys_values(k, v, step)
        out = self.attend(q, keys.to(q.dtype), values.to(q.dtype), mask)
        return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)

    def heads(self, t: torch.Tensor, norm: nn.Module | None = None) -> torch.Tensor:
        """``[B, T, n * head_dim]`` as ``[B, n, T, head_dim]``, each head normed by ``norm`` first."""
        t = t.view(t.shape[0], t.shape[1], -1, self.shape.head_dim)
        if norm is not None:
            t = norm(t)
        return t.transpose(1, 2)

    def rotate(self, t: torch.Tensor, step) -> torch.Tensor:
        """RoPE on ``t`` ``[B, n, T, head_dim]`` at the step's positions (none on a NoPE layer)."""
        if self.rotary is None:
            return t
        cos, sin = step.rope(self.rope_table)
        return self.rotary(t, cos, sin)

    def query(self, q: torch.Tensor, step) -> torch.Tensor:
        """The queries ``[B, heads, T, head_dim]``: normed per head, rotated."""
        return self.rotate(self.heads(q, self.q_norm), step)

    def value_heads(self, v: torch.Tensor) -> torch.Tensor:
        """The values ``[B, kv_heads, T, head_dim]``."""
        return self.heads(v)

    def keys_values(self, k: torch.Tensor, v: torch.Tensor, step) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This call's keys and values written to the cache; the keys, values and mask ``[1, 1, T, keys]`` to attend."""
        return self.cache(self.rotate(self.heads(k, self.k_norm), step), self.value_heads(v), step)

    def cache(self, k: torch.Tensor, v: torch.Tensor, step) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write ``k``, ``v`` ``[B, kv_heads, T, head_dim]`` to the cache, the step's way; what to attend."""
        if getattr(self, "keeps_sinks", False):  # a cache of sink tokens and a ring of recent ones (blocks.sinks)
            return step.sink_cache(self, k, v)
        caches = quantized(self)
        if caches is not None:  # int8 caches (quantize_kv_caches): the step's int8 way
            if self.window is None:
                return step.int8_full_cache(caches, k, v)
            return step.int8_ring_cache(self.window, caches, k, v)
        if self.window is None:
            return step.full_cache(self.key_cache, self.value_cache, k, v)
        return step.ring_cache(self.window, self.key_cache, self.value_cache, k, v)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The SDPA composite: ``[B, heads, T, head_dim]``."""
        return self.sdpa(q, keys, values, mask)
