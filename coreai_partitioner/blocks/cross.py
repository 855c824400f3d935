"""A decoder that attends an encoder's output: cross-attention keys and values made once, a layer, the output head.

Encoder-decoder models (Whisper, T5) run in two methods: ``encoder`` once per
input, ``text_decoder`` once per token.  The cross-attention keys and values
are a function of the input alone, so ``encoder`` computes them
(:class:`CrossKeysValues`, stacked by :func:`cross_of`) and returns them as
its one output ``[1, 2 * layers * heads, frames, head_dim]`` (layer ``i``'s
keys, then its values, as heads); ``text_decoder`` takes that output on every
call and cuts it into each layer's keys and values (:func:`split_cross`).
Nothing of the cross attention is state: a new input needs no reset.
:class:`CrossAttention` attends those keys and values through the SDPA
composite (not causal, no mask), :class:`CrossDecoderLayer` is the
pre-norm layer both models use, :func:`decode_layers` runs a call through
them, and :class:`CrossDecoder` is ``text_decoder`` around them.
"""

from __future__ import annotations

import torch
from coreai_torch.composite_ops import SDPA
from torch import nn

from coreai_partitioner.blocks.step import Step
from coreai_partitioner.partition.boundaries import outside_delegate


def heads_of(t: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """``[B, T, heads * head_dim]`` as ``[B, heads, T, head_dim]``."""
    return t.view(t.shape[0], t.shape[1], heads, head_dim).transpose(1, 2)


class CrossKeysValues(nn.Module):
    """A decoder layer's cross-attention key and value projections, which run in ``encoder``, once per input."""

    def __init__(self, heads: int, head_dim: int, *, k: nn.Module, v: nn.Module) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.k, self.v = k, v

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """The keys then the values of ``states`` [1, frames, d] as heads: ``[1, 2 * heads, frames, head_dim]``."""
        keys, values = heads_of(self.k(states), self.heads, self.head_dim), heads_of(self.v(states), self.heads, self.head_dim)
        return torch.cat([keys, values], dim=1)


def cross_of(projections: nn.ModuleList, states: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``encoder``'s output: every layer's keys and values of ``states`` (:class:`CrossKeysValues`), at ``dtype``
    (the decoder's, where the encoder computes wider) or as computed."""
    cross = torch.cat([projection(states) for projection in projections], dim=1)
    return cross if dtype is None else cross.to(dtype)


def split_cross(cross: torch.Tensor, layers: int, heads: int) -> list[torch.Tensor]:
    """Each layer's keys, then values, ``[1, heads, frames, head_dim]`` each, out of ``encoder``'s one output.

    Trace it outside the delegate (:func:`~coreai_partitioner.partition.boundaries.outside_delegate`):
    ExecuTorch's copies of these contiguous blocks cost a memcpy, where Core AI
    on Linux copies each slice element by element (for Whisper base, 37 MB a
    call, a third of its time).
    """
    per_layer = cross.view(2 * layers, 1, heads, cross.shape[2], cross.shape[3])
    return [per_layer[i] for i in range(per_layer.shape[0])]


class CrossAttention(nn.Module):
    """Attention of the decoder's tokens to the input: the query projection, the SDPA composite over the keys and
    values ``encoder`` gave (not causal, no mask: every token attends every frame), the output projection."""

    def __init__(self, path: str, heads: int, head_dim: int, *, q: nn.Module, o: nn.Module, scale: float) -> None:
        super().__init__()
        self.path = path
        self.heads, self.head_dim = heads, head_dim
        self.q, self.o = q, o
        self.sdpa = SDPA(scale=float(scale), is_causal=False)

    def forward(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        q = heads_of(self.q(x), self.heads, self.head_dim)
        out = self.sdpa(q, keys.to(q.dtype), values.to(q.dtype))
        return self.o(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class CrossDecoderLayer(nn.Module):
    """A pre-norm decoder layer: ``h = x + self_attn(norm1(x))``, ``h + cross(norm2(h))``, then ``h + mlp(norm3(h))``."""

    def __init__(
        self, attention: nn.Module, cross: CrossAttention, mlp: nn.Module, *, norm1: nn.Module, norm2: nn.Module, norm3: nn.Module
    ) -> None:
        super().__init__()
        self.attention, self.cross, self.mlp = attention, cross, mlp
        self.norm1, self.norm2, self.norm3 = norm1, norm2, norm3

    def forward(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, step) -> torch.Tensor:
        h = x + self.attention(self.norm1(x), step)
        h = h + self.cross(self.norm2(h), keys, values)
        return h + self.mlp(self.norm3(h))


def decode_layers(layers: nn.ModuleList, hidden: torch.Tensor, cross: torch.Tensor, step) -> torch.Tensor:
    """``hidden`` [1, T, d] through each :class:`CrossDecoderLayer` of ``layers``, each attending its keys and values
    of ``cross`` (``encoder``'s output, split outside the delegate: :func:`split_cross`), the caches the ``step``'s
    way (:class:`~coreai_partitioner.blocks.Step`, or the device form's)."""
    step.dtype = hidden.dtype
    with outside_delegate():
        parts = split_cross(cross, len(layers), layers[0].cross.heads)
    for index, layer in enumerate(layers):
        hidden = layer(hidden, parts[2 * index], parts[2 * index + 1], step)
    step.finish()
    return hidden


class CrossDecoder(nn.Module):
    """``text_decoder(ids [1, 1], cross, cache_position [1]) -> logits [1, 1, vocab]``, one token a call.

    The self-attention caches are buffers of its layers' attention,
    ``max_decode_len`` slots each; the host form lowers them as the
    delegate's state, the device form
    (:class:`~coreai_partitioner.text_decoder.device.DeviceTextDecoder`) keeps them
    ExecuTorch's.  A model's decoder gives :meth:`run`: its embedding, then
    :func:`decode_layers`, its norm and its head.
    """

    def __init__(self, layers: list[CrossDecoderLayer], norm: nn.Module, max_decode_len: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.max_decode_len = max_decode_len
        #: Read by :class:`~coreai_partitioner.blocks.Step`: no RoPE, no sliding windows.
        self.rope_tables = nn.ModuleDict()
        self.context = max_decode_len

    def forward(self, ids: torch.Tensor, cross: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        return self.run(ids, cache_position, cross, Step(self, cache_position))

    def run(self, ids: torch.Tensor, positions: torch.Tensor, cross: torch.Tensor, step: Step) -> torch.Tensor:
        """The logits of ``ids`` [1, T] at ``positions``, the caches the ``step``'s way (the device form's too)."""
        raise NotImplementedError(f"{type(self).__name__} gives run(ids, positions, cross, step)")


def output_logits(weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """``hidden`` [1, T, d] through an output projection of ``weight`` [vocab, d]: ``[1, T, vocab]``.

    ``weight @ hidden^T``, transposed back: ``linear(hidden, weight)`` would
    transpose the ``[vocab, d]`` table, which Core AI materializes on every
    call.  The result in the default dim order (the device form's runtime requires it).
    """
    logits = torch.matmul(weight, hidden[0].transpose(0, 1)).transpose(0, 1).unsqueeze(0)
    return logits.clone(memory_format=torch.contiguous_format)
