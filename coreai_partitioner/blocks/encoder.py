"""An encoder's layer: bidirectional self-attention over a call's own tokens, no cache, and a plain MLP.

Vision towers (CLIP, SigLIP, ViT) and speech encoders (Whisper) are stacks of
the same pre-norm layer: ``h = x + attn(norm1(x))``, then ``h + mlp(norm2(h))``
(:class:`EncoderLayer`).  BERT-class text encoders (BERT, RoBERTa, DistilBERT,
the original Transformer's encoder) normalize after each residual sum instead:
``h = norm1(x + attn(x))``, then ``norm2(h + mlp(h))`` (:class:`PostNormEncoderLayer`).
The norms are the Hugging Face ``LayerNorm`` modules themselves, which
coreai-torch converts to its ``layer_norm`` composite; attention is the SDPA
composite, not causal.
"""

from __future__ import annotations

import torch
from coreai_torch.composite_ops import SDPA
from torch import nn

from coreai_partitioner.blocks.mlp import activation


class EncoderAttention(nn.Module):
    """Self-attention of a call's tokens among themselves (no cache, not causal), through the SDPA composite.

    ``q``, ``k``, ``v``, ``o`` are the HF projections (``out_proj`` for
    ``o``), ``heads`` of ``head_dim`` each.  A ``mask`` ``[1, 1, T, T]`` (True:
    attend) limits who attends whom; without one every token attends every
    token.  A mask ``[B, 1, T, T]`` gives each of a batch's sequences its own
    (a padding mask).
    """

    def __init__(
        self, path: str, heads: int, head_dim: int, *, q: nn.Module, k: nn.Module, v: nn.Module, o: nn.Module, scale: float
    ) -> None:
        super().__init__()
        self.path = path
        self.heads, self.head_dim = heads, head_dim
        self.q, self.k, self.v, self.o = q, k, v, o
        self.sdpa = SDPA(scale=float(scale), is_causal=False)

    def split(self, t: torch.Tensor) -> torch.Tensor:
        """``[B, T, heads * head_dim]`` as ``[B, heads, T, head_dim]``."""
        return t.view(t.shape[0], t.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        out = self.sdpa(q, k, v) if mask is None else self.sdpa(q, k, v, mask)
        return self.o(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class MLP(nn.Module):
    """``fc2(act(fc1(x)))``: the encoders' MLP, ``act`` a name HF gives (``hidden_act``)."""

    def __init__(self, act: str, *, fc1: nn.Module, fc2: nn.Module) -> None:
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class EncoderLayer(nn.Module):
    """One pre-norm encoder layer: ``h = x + attn(norm1(x))``, then ``h + mlp(norm2(h))``."""

    def __init__(self, attention: EncoderAttention, mlp: nn.Module, *, norm1: nn.Module, norm2: nn.Module) -> None:
        super().__init__()
        self.attention, self.mlp = attention, mlp
        self.norm1, self.norm2 = norm1, norm2

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = x + self.attention(self.norm1(x), mask)
        return h + self.mlp(self.norm2(h))


class PostNormEncoderLayer(nn.Module):
    """One post-norm encoder layer: ``h = norm1(x + attn(x))``, then ``norm2(h + mlp(h))``."""

    def __init__(self, attention: EncoderAttention, mlp: nn.Module, *, norm1: nn.Module, norm2: nn.Module) -> None:
        super().__init__()
        self.attention, self.mlp = attention, mlp
        self.norm1, self.norm2 = norm1, norm2

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.norm1(x + self.attention(x, mask))
        return self.norm2(h + self.mlp(h))
