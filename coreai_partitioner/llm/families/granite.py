"""Granite: Llama's layers with multipliers.

``embedding_multiplier`` scales the embedding, ``attention_multiplier`` is
the attention scale itself (not ``1 / sqrt(head_dim)``),
``residual_multiplier`` scales each layer's two residual branches, and the
logits are divided by ``logits_scaling``.  Composites: every RMSNorm, every
attention, RoPE on q and k.
"""

from __future__ import annotations

from typing import Any

MODEL_TYPES = ("granite",)


def build(build):
    config = build.config
    layers = []
    for i, layer in enumerate(build.base.layers):
        attention = build.attention(f"model.layers.{i}.self_attn", layer.self_attn, i, scale=config.attention_multiplier)
        layers.append(
            build.block(
                attention,
                build.mlp(layer.mlp),
                pre_attn=build.norm(layer.input_layernorm),
                pre_mlp=build.norm(layer.post_attention_layernorm),
                residual_scale=config.residual_multiplier,
            )
        )
    return build.decoder(layers, embed_scale=config.embedding_multiplier, logits_scale=config.logits_scaling)


def tiny_config(model_type: str) -> Any:
    import transformers

    return transformers.GraniteConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attention_bias=True,
        mlp_bias=True,
        embedding_multiplier=12.0,
        attention_multiplier=0.015625,
        residual_multiplier=0.22,
        logits_scaling=8.0,
        tie_word_embeddings=True,
    )
