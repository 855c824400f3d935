"""T5's relative position bias: bucketed, looked up from constant tables, added to the scores through the SDPA composite.

T5 adds to each attention score a learned bias per head that depends only on
``key position - query position``, bucketed (exact up to 8 apart, then
logarithmic up to ``relative_attention_max_distance``).  The bucket of every
relative position a method can see is computed once, at export, by Hugging
Face's own ``_relative_position_bucket`` into a constant table
(:class:`RelativePositionBias`): the graph holds no ``log``, only a
subtraction and two gathers (the table, then the model's own
``relative_attention_bias`` weight), made once per call and shared by every
layer, as T5 shares its first layer's bias.

coreai-torch's SDPA composite (0.4.3) takes a boolean mask: it adds ``-1e4``
where the mask is false, so a float bias cannot be passed as the mask.
:func:`attend_with_bias` adds it through the dot product instead, which is
exact: each query gets a one-hot of its row appended, each key the bias of
its column, so ``q' . k'_j = q . k_j + bias[i, j]``; the values get as many
zero columns, which the output drops.  A call of ``Tq`` queries attends with
``head_dim + Tq`` columns: one for a decoder step, ``T`` for the encoder (its
score and value products grow by ``T / head_dim``: at ``T = 512`` and
``head_dim = 64``, 9 times; at T5-small's width (``d_model`` 512, ``d_ff``
2048, 8 heads) a layer's projections and MLP still outweigh them below about
400 tokens).
"""

from __future__ import annotations

import torch
from torch import nn

from coreai_partitioner import _compat


class RelativePositionBias(nn.Module):
    """T5's bias of keys at some positions for queries at others: :meth:`forward` gives ``[1, heads, Tq, Tk]``.

    ``weight`` is Hugging Face's ``relative_attention_bias.weight``
    ``[num_buckets, heads]`` (the module's own parameter, nothing copied);
    ``buckets`` the bucket of each relative position from ``-(span - 1)`` to
    ``span - 1``, a constant of ``2 * span - 1`` integers; ``positions`` the
    positions ``0 .. span - 1`` as floats, which a call of ``T`` tokens slices
    (``positions[:T]``: a slice of a constant, which the delegate takes where
    an ``arange`` of a symbolic length would stay outside).  Positions are
    floats holding integers, exact below 2**24, as the device form carries them.
    """

    def __init__(self, weight: nn.Parameter, buckets: torch.Tensor, span: int) -> None:
        super().__init__()
        self.weight = weight
        self.span = span
        self.register_buffer("buckets", buckets.to(torch.int32), persistent=False)
        self.register_buffer("positions", torch.arange(span, dtype=torch.float32), persistent=False)

    @classmethod
    def of(cls, hf_attention: nn.Module, span: int, *, bidirectional: bool) -> RelativePositionBias:
        """The bias of a Hugging Face ``T5Attention`` that has one, for positions ``0 .. span - 1``."""
        buckets = _compat.t5_relative_position_bucket(hf_attention, torch.arange(-(span - 1), span), bidirectional=bidirectional)
        return cls(hf_attention.relative_attention_bias.weight, buckets, span)

    def first(self, length: int) -> torch.Tensor:
        """The positions ``0 .. length - 1`` (floats)."""
        return self.positions[:length]

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        relative = key_positions.float().unsqueeze(0) - query_positions.float().unsqueeze(-1) + float(self.span - 1)
        buckets = self.buckets[relative.to(torch.int32)]  # [Tq, Tk]
        return nn.functional.embedding(buckets, self.weight).permute(2, 0, 1).unsqueeze(0)


def attend_with_bias(
    sdpa: nn.Module, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
    query_positions: torch.Tensor, mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``softmax(q k^T * scale + bias, masked) v`` through the SDPA composite ``sdpa`` (built with ``scale=1.0``).

    ``q`` ``[B, H, Tq, D]`` at ``query_positions`` ``[Tq]`` (distinct: their
    one-hot rows are made from them), ``keys`` and ``values`` ``[B, H, Tk, D]``,
    ``bias`` ``[1, H, Tq, Tk]`` floats, ``mask`` ``[.., Tq, Tk]`` booleans
    (True: attend) or ``None``.  Exact: the bias rides in the dot product
    (see the module); the output is ``[B, H, Tq, D]``.
    """
    batch, heads, length, dim = q.shape
    one_hot = (query_positions.unsqueeze(-1) == query_positions.unsqueeze(0)).to(q.dtype).expand(batch, heads, length, length)
    q = torch.cat([q, one_hot], dim=-1)
    keys = torch.cat([keys, bias.to(keys.dtype).transpose(-1, -2).expand(batch, heads, keys.shape[2], length)], dim=-1)
    values = torch.cat([values, torch.zeros_like(keys[..., dim:])], dim=-1)
    out = sdpa(q, keys, values) if mask is None else sdpa(q, keys, values, mask)
    return out[..., :dim]
