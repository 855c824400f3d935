"""Granite: Llama's layers with multipliers.

``embedding_multiplier`` scales the embedding, ``attention_multiplier`` is
the attention scale itself (not ``1 / sqrt(head_dim)``),
``residual_multiplier`` scales each layer's two residual branches, and the
logits are divided by ``logits_scaling``.  Composites: every RMSNorm, every
attention, RoPE on q and k.
"""

from __future__ import annotations

from typing import Any

import torch

from coreai_partitioner.blocks import Block
from coreai_partitioner.text_decoder.families._tiny import tiny

MODEL_TYPES = ("granite",)


class ScaledResidualBlock(Block):
    """Llama's layer with each branch scaled by ``residual_multiplier`` before it joins the residual."""

    def __init__(self, residual_multiplier: float, *args, **options) -> None:
        super().__init__(*args, **options)
        self.residual_multiplier = float(residual_multiplier)

    def residual(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return x + out * self.residual_multiplier


def build(build):
    config = build.config
    layers = [
        ScaledResidualBlock(
            config.residual_multiplier,
            build.attention(i, scale=config.attention_multiplier),
            build.mlp(layer.mlp),
            pre_attn=build.norm(layer.input_layernorm),
            pre_mlp=build.norm(layer.post_attention_layernorm),
        )
        for i, layer in enumerate(build.base.layers)
    ]
    return build.decoder(layers, embed_scale=config.embedding_multiplier, logits_scale=config.logits_scaling)


def tiny_config(model_type: str) -> Any:
    return tiny(
        "GraniteConfig", num_hidden_layers=2, attention_bias=True, mlp_bias=True, embedding_multiplier=12.0,
        attention_multiplier=0.015625, residual_multiplier=0.22, logits_scaling=8.0, tie_word_embeddings=True,
    )
