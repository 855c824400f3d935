"""Random small transformer-like models for property-based tests (tests/test_fuzz.py, benchmarks/fuzz.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import nn

from coreai_partitioner import ExternalizeSpec, default_specs
from coreai_torch.composite_ops import RMSNorm, RoPE, SDPA


@dataclass(frozen=True)
class Config:
    layers: int
    dim: int
    heads: int
    kv_heads: int
    seq: int
    causal: bool
    rope: bool
    sdpa: bool  # the SDPA composite, or attention written out
    composite_norm: bool  # RMSNorm composite, or a plain norm
    shared_norm: bool  # one norm instance for every layer
    norm_calls: int  # how often each block calls its norm
    nested: bool  # externalize the blocks around their composites
    seed: int


class PlainNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


def make_norm(config: Config) -> nn.Module:
    norm = RMSNorm(config.dim) if config.composite_norm else PlainNorm(config.dim)
    with torch.no_grad():
        for parameter in norm.parameters():
            parameter.uniform_(0.5, 1.5)
    return norm


class FuzzBlock(nn.Module):
    def __init__(self, config: Config, norm: nn.Module) -> None:
        super().__init__()
        self.heads, self.kv_heads = config.heads, config.kv_heads
        self.head_dim = config.dim // config.heads
        self.norm_calls = config.norm_calls
        self.norm = norm
        self.q = nn.Linear(config.dim, config.dim, bias=False)
        self.kv = nn.Linear(config.dim, 2 * self.kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(config.dim, config.dim, bias=False)
        self.rope = RoPE() if config.rope else None
        self.causal = config.causal
        self.sdpa = SDPA(is_causal=config.causal) if config.sdpa else None
        self.mlp = nn.Sequential(nn.Linear(config.dim, 2 * config.dim), nn.SiLU(), nn.Linear(2 * config.dim, config.dim))

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.sdpa is not None:
            return self.sdpa(q, k, v)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = x
        for _ in range(self.norm_calls):
            h = self.norm(h)
        q = self.q(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.rope is not None:
            q, k = self.rope(q, position_ids=positions), self.rope(k, position_ids=positions)
        x = x + self.o(self.attention(q, k, v).transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm(x))


class FuzzModel(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        torch.manual_seed(config.seed)
        shared = make_norm(config) if config.shared_norm else None
        self.blocks = nn.ModuleList(FuzzBlock(config, shared or make_norm(config)) for _ in range(config.layers))
        self.final_norm = make_norm(config)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, positions)
        return self.final_norm(x)


def sample(config: Config) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(config.seed)
    x = torch.randn(1, config.seq, config.dim, generator=generator)
    return x, torch.arange(config.seq, dtype=torch.float32)[None]


def specs(config: Config) -> list:
    chosen = default_specs()
    if config.nested:
        chosen.append(ExternalizeSpec(FuzzBlock))
    return chosen


@st.composite
def configs(draw: st.DrawFn) -> Config:
    heads = draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([4, 8]))
    return Config(
        layers=draw(st.integers(1, 3)),
        dim=heads * head_dim,
        heads=heads,
        kv_heads=draw(st.sampled_from([k for k in (1, 2, 4) if heads % k == 0])),
        seq=draw(st.integers(2, 10)),
        causal=draw(st.booleans()),
        rope=draw(st.booleans()),
        sdpa=draw(st.booleans()),
        composite_norm=draw(st.booleans()),
        shared_norm=draw(st.booleans()),
        norm_calls=draw(st.integers(1, 3)),
        nested=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def build(config: Config) -> FuzzModel:
    return FuzzModel(config).eval()
