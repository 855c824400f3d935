"""A small decoder-only transformer built from coreai-torch composite ops.

Shared by the examples, the tests and the benchmarks: RMSNorm and SDPA come
from ``coreai_torch.composite_ops``, so ``default_specs()`` externalizes them.
"""

from __future__ import annotations

import torch
from torch import nn

from coreai_torch.composite_ops import RMSNorm, SDPA


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.kv_heads = kv_heads or heads
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k = nn.Linear(dim, self.kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, self.kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.sdpa = SDPA(is_causal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        y = self.sdpa(q, k, v)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int | None = None) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = Attention(dim, heads, kv_heads)
        self.mlp_norm = RMSNorm(dim)
        self.up = nn.Linear(dim, 2 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.down(torch.nn.functional.silu(self.up(self.mlp_norm(x))))


class TinyTransformer(nn.Module):
    """``layers`` blocks of (RMSNorm, SDPA, RMSNorm, MLP) over embeddings of width ``dim``."""

    def __init__(self, layers: int = 2, dim: int = 64, heads: int = 4, kv_heads: int | None = None, vocab: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, RMSNorm):
                    module.weight.uniform_(0.5, 1.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
