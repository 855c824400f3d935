"""The benchmark model: L blocks of (RMSNorm, SDPA, RMSNorm, MLP) over hidden states of width d.

12 d^2 weights a block (attention 4 d^2, MLP with hidden width 4 d: 8 d^2), so
L=4, d=2048 holds 768 MiB of fp32 weights.
"""

from __future__ import annotations

import torch
from torch import nn

from coreai_torch.composite_ops import RMSNorm, SDPA


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.sdpa = SDPA(is_causal=True)
        self.mlp_norm = RMSNorm(dim)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.o(self.sdpa(q, k, v).transpose(1, 2).reshape(b, s, d))
        return x + self.down(torch.nn.functional.silu(self.up(self.mlp_norm(x))))


class Blocks(nn.Module):
    def __init__(self, layers: int, dim: int, heads: int | None = None) -> None:
        super().__init__()
        heads = heads or max(1, dim // 64)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def build(layers: int, dim: int, dtype: torch.dtype = torch.float32, seq: int = 16):
    """The model (eval, weights seeded) and its sample input."""
    torch.manual_seed(0)
    model = Blocks(layers, dim).to(dtype).eval()
    return model, torch.randn(1, seq, dim, dtype=dtype)


def weight_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
