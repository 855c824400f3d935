"""Phi-3 and Phi-4-mini: Llama's layers over fused projections, partial RoPE, LongRoPE.

``qkv_proj`` is split into q, k, v and ``gate_up_proj`` into gate and up
(in that order).  RoPE rotates the first ``partial_rotary_factor`` of each
head (the ``rope`` composite's ``dims``).  LongRoPE picks the long factors
for a call whose last position is past ``original_max_position_embeddings``,
as HF's forward does; keys already cached keep the factors they were
rotated with (HF's ``generate`` instead recomputes the whole sequence when a
decode step crosses that length).  Composites: every RMSNorm, every
attention, RoPE on q and k.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coreai_partitioner.blocks import Attention, GatedMLP
from coreai_partitioner.text_decoder.families._tiny import tiny

MODEL_TYPES = ("phi3",)


class FusedQKVAttention(Attention):
    """Attention over one fused projection ``qkv``, split into q, k and v in that order."""

    def __init__(self, *args, qkv: nn.Module, **options) -> None:
        super().__init__(*args, **options)
        self.qkv = qkv

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h, kv, d = self.shape.heads, self.shape.kv_heads, self.shape.head_dim
        return self.qkv(x).split([h * d, kv * d, kv * d], dim=-1)


class FusedGateUpMLP(GatedMLP):
    """The gated MLP over one fused projection ``gate_up``, gate first."""

    def __init__(self, act: str, *, gate_up: nn.Module, down: nn.Module) -> None:
        super().__init__(act, gate=None, up=None, down=down)
        self.gate_up = gate_up

    def gate_and_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gate_up(x).chunk(2, dim=-1)


def build(build):
    layers = []
    for i, layer in enumerate(build.base.layers):
        attention = build.attention(i, kind=FusedQKVAttention, qkv=layer.self_attn.qkv_proj)
        mlp = FusedGateUpMLP(build.activation(), gate_up=layer.mlp.gate_up_proj, down=layer.mlp.down_proj)
        layers.append(build.pre_norm_block(layer, attention, mlp))
    return build.decoder(layers)


def tiny_config(model_type: str) -> Any:
    longrope = {"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.5], "long_factor": [1.0, 2.0, 4.0, 8.0]}
    return tiny(
        "Phi3Config", num_hidden_layers=2, max_position_embeddings=64, original_max_position_embeddings=16,
        partial_rotary_factor=0.5, rope_scaling=longrope,
    )
