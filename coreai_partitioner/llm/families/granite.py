"""Granite: Llama's layers with multipliers.

``embedding_multiplier`` scales the embedding, ``attention_multiplier`` is
the attention scale itself (not ``1 / sqrt(head_dim)``),
``residual_multiplier`` scales each layer's two residual branches, and the
logits are divided by ``logits_scaling``.  Composites: every RMSNorm, every
attention, RoPE on q and k.
"""

from __future__ import annotations

from typing import Any

from coreai_partitioner.llm.families._tiny import tiny

MODEL_TYPES = ("granite",)


def build(build):
    config = build.config
    layers = [
        build.pre_norm_block(
            layer, build.attention(i, scale=config.attention_multiplier), residual_scale=config.residual_multiplier
        )
        for i, layer in enumerate(build.base.layers)
    ]
    return build.decoder(layers, embed_scale=config.embedding_multiplier, logits_scale=config.logits_scaling)


def tiny_config(model_type: str) -> Any:
    return tiny(
        "GraniteConfig", num_hidden_layers=2, attention_bias=True, mlp_bias=True, embedding_multiplier=12.0,
        attention_multiplier=0.015625, residual_multiplier=0.22, logits_scaling=8.0, tie_word_embeddings=True,
    )
