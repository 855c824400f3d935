"""Mixtral: Mistral's layers with a mixture-of-experts MLP in every layer, through ``gather_mm``.

The router takes a softmax over the experts, then the top
``num_experts_per_tok``, always renormalized; ``intermediate_size`` is each
expert's width.  Sliding windows as Mistral's.  Composites: every RMSNorm,
attention and RoPE, two ``gather_mm`` per layer.
"""

from __future__ import annotations

from typing import Any

MODEL_TYPES = ("mixtral",)


def build(build):
    layers = []
    for i, layer in enumerate(build.base.layers):
        layers.append(
            build.block(
                build.attention(f"model.layers.{i}.self_attn", layer.self_attn, i),
                build.moe(layer.mlp, "softmax_topk_renorm"),
                pre_attn=build.norm(layer.input_layernorm),
                pre_mlp=build.norm(layer.post_attention_layernorm),
            )
        )
    return build.decoder(layers)


def tiny_config(model_type: str) -> Any:
    import transformers

    return transformers.MixtralConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        sliding_window=8,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
