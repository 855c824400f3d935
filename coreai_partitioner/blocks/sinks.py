"""Attention sinks past the context (StreamingLLM): a cache of ``S`` sink tokens and a ring of ``L - S`` recent ones.

:func:`attention_sinks` makes every full-attention layer of a decoder keep,
in its cache of ``L`` slots, the first ``S`` positions (slots ``0..S-1``) and
a ring of the last ``R = L - S`` (position ``p`` in slot ``S + (p - S) % R``),
so generation goes on past ``L`` in a fixed cache.  A query at ``q`` attends
the sinks and the positions in ``(q - R, q]``.

**RoPE.**  StreamingLLM gives the keys positions *within the cache*: the
sinks ``0..S-1``, the ring's keys ``S..L-1`` in order, the newest query
``L - 1``.  RoPE is relative (a query rotated at ``a`` against a key rotated
at ``b`` depends on ``a - b`` alone), so this is the same as keeping the
ring's keys and the queries at their true positions and moving the sinks
forward: a call whose last position is ``last`` attends each sink rotated
by ``shift = max(0, last - (L - 1))`` more (its distance to the newest query
is then ``L - 1 - s``, StreamingLLM's).  The keys stay stored rotated at
their true positions (no unrotated copy, no re-rotation of the ring); only
the ``S`` sink rows turn, by a per-slot angle that is zero elsewhere (an
exact identity there).  Below ``L`` the shift is 0: the model's own attention.

A family is refused when a layer's attention is not RoPE over a KV cache
(recurrent layers, NoPE layers) or its RoPE is not a function of position
differences alone (LongRoPE switches its frequencies by the sequence's length).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

#: The positions a sink decoder runs to: fp32 holds every integer below 2**24 exactly (the device form's positions,
#: RoPE's angles); ExecuTorch's runner is told it as the context (``get_max_context_len``), so it never stops sooner.
POSITIONS = 2**24 - 1


class UnsupportedSinks(ValueError):
    """A model or shape attention sinks cannot be built for; names why and what to do."""


@dataclass
class SinkPlan:
    """One call's share of a sink cache of ``L`` slots: the mask, the write, the sinks' extra rotation."""

    mask: torch.Tensor  # [1, 1, T, L + T] bool: the cache's slots, then the call's own rows
    one_hot: torch.Tensor  # [T, L]: token t goes to slot s
    kept: torch.Tensor  # [L, 1]: 1 where a slot keeps its content
    shift: torch.Tensor  # [L]: each slot's extra rotation (the sinks' shift, 0 elsewhere)


def sink_slot(position: torch.Tensor, sinks: int, size: int) -> torch.Tensor:
    """The slot of position ``position`` (float) in a cache of ``size`` slots whose first ``sinks`` are sinks."""
    ring = float(size - sinks)
    wrapped = float(sinks) + (position - sinks) - torch.floor((position - sinks) / ring) * ring
    return torch.where(position < sinks, position, wrapped)


def held_positions(first: torch.Tensor, sinks: int, size: int) -> torch.Tensor:
    """``[size]``: the position each slot holds before a call at ``first`` (every earlier position written in order),
    ``-1`` where the slot was never written by this sequence."""
    slots = torch.arange(size, dtype=first.dtype, device=first.device)
    ring = float(size - sinks)
    # ring slot s holds the latest p < first with p >= sinks and p = s (mod ring)
    back = first - 1.0 - slots
    latest = first - 1.0 - (back - torch.floor(back / ring) * ring)
    ring_held = torch.where(latest >= sinks, latest, torch.full_like(latest, -1.0))
    sink_held = torch.where(slots < first, slots, torch.full_like(slots, -1.0))
    return torch.where(slots < sinks, sink_held, ring_held)


def sink_plan(position: torch.Tensor, sinks: int, size: int) -> SinkPlan:
    """The plan of a call at ``position`` [T] (float, consecutive, ``T <= size - sinks``) over a sink cache."""
    ring = float(size - sinks)
    first, last = position.min(), position.max()
    held = held_positions(first, sinks, size)
    query = position.unsqueeze(-1)
    in_reach = (held >= 0.0) & ((held < sinks) | (query - held < ring))  # [T, size]
    own = (position <= query) & (query - position < ring)
    mask = torch.cat([in_reach, own], dim=-1)[None, None]
    slots = torch.arange(size, dtype=position.dtype, device=position.device)
    one_hot = (sink_slot(position, sinks, size).unsqueeze(-1) == slots).to(position.dtype)  # [T, size]
    kept = 1.0 - one_hot.sum(0).unsqueeze(-1)
    shift = torch.clamp(last - float(size - 1), min=0.0)
    return SinkPlan(mask, one_hot, kept, torch.where(slots < sinks, shift.expand(size), torch.zeros_like(slots)))


def attention_sinks(decoder: nn.Module, sinks: int, prefill_chunk: int) -> nn.Module:
    """Make every full-attention cache of ``decoder`` (a :class:`~coreai_partitioner.text_decoder.Decoder`) keep
    ``sinks`` sink tokens and a ring of the rest (:mod:`.sinks`); its context becomes :data:`POSITIONS`.  Refuses,
    naming why, a family whose attention is not RoPE over a KV cache."""
    from coreai_partitioner.blocks.attention import Attention

    model_type = getattr(decoder, "model_type", type(decoder).__name__)
    size = decoder.context
    if not 0 <= sinks < size:  # 0: a ring alone (window attention, what sinks are measured against)
        raise UnsupportedSinks(f"{model_type}: --attention-sink {sinks} must be between 1 and the cache length {size} - 1")
    if prefill_chunk > size - sinks:
        raise UnsupportedSinks(
            f"{model_type}: a call of up to {prefill_chunk} tokens (--prefill-chunk) is longer than the ring of "
            f"{size - sinks} recent slots; give --prefill-chunk {size - sinks} or less"
        )
    for index, layer in enumerate(decoder.layers):
        mixer = [m for m in layer.modules() if isinstance(m, Attention)]
        if not mixer:
            raise UnsupportedSinks(
                f"{model_type}: layer {index} keeps recurrent state, not a KV cache: its past cannot be evicted as a "
                "ring; attention sinks take decoders whose every layer is RoPE attention over a KV cache"
            )
        for attention in mixer:
            if attention.rotary is None:
                raise UnsupportedSinks(
                    f"{model_type}: {attention.path} applies no RoPE (a NoPE layer): positions within the cache "
                    "mean nothing to it; attention sinks take decoders whose every layer is RoPE attention"
                )
            table = decoder.rope_tables[attention.rope_table]
            if table.long:
                raise UnsupportedSinks(
                    f"{model_type}: {attention.path}'s LongRoPE picks its frequencies by the sequence's length, not "
                    "by position differences alone; attention sinks take RoPE that is relative"
                )
            if attention.owns_cache and quantized_cache(attention):
                raise UnsupportedSinks(f"{model_type}: attention sinks over int8 caches are not built; leave out --kv-cache int8")
            if attention.owns_cache and attention.window is None:
                attention.sinks = sinks
                attention.keeps_sinks = True
    decoder.context = POSITIONS
    return decoder


def quantized_cache(attention: nn.Module) -> bool:
    from coreai_partitioner.blocks.quantized_cache import quantized

    return quantized(attention) is not None


def re_rotate(attention: nn.Module, keys: torch.Tensor, shift: torch.Tensor, step) -> torch.Tensor:
    """``keys`` [B, H, L, D] each turned by RoPE at ``shift`` [L] more (the model's frequencies, no attention
    scaling: a rotation of a key already scaled once)."""
    table = step.decoder.rope_tables[attention.rope_table]
    angle = shift.float().unsqueeze(-1) * table.inv_freq
    cos, sin = angle.cos().to(keys.dtype)[None, None], angle.sin().to(keys.dtype)[None, None]
    return attention.rotary(keys, cos, sin)
