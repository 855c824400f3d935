"""OLMoE: pre-norm layers, q and k normed over the whole projection, a mixture-of-experts MLP in every layer.

The router takes a softmax over the experts, then the top
``num_experts_per_tok`` (renormalized only with ``norm_topk_prob``).
``clip_qkv`` would clamp q, k and v after their norms; it is not adapted.
Composites: every RMSNorm, attention and RoPE, two ``gather_mm`` per layer.
"""

from __future__ import annotations

from typing import Any

MODEL_TYPES = ("olmoe",)


def build(build):
    config = build.config
    if getattr(config, "clip_qkv", None) is not None:
        raise build.refuse("clip_qkv", config.clip_qkv, "None (clamping q, k and v is not adapted)")
    routing = "softmax_topk_renorm" if config.norm_topk_prob else "softmax_topk"
    layers = []
    for i, layer in enumerate(build.base.layers):
        attn = layer.self_attn
        attention = build.attention(
            f"model.layers.{i}.self_attn",
            attn,
            i,
            q_norm=build.norm(attn.q_norm),
            k_norm=build.norm(attn.k_norm),
            norm_width="all",
        )
        layers.append(
            build.block(
                attention,
                build.moe(layer.mlp, routing),
                pre_attn=build.norm(layer.input_layernorm),
                pre_mlp=build.norm(layer.post_attention_layernorm),
            )
        )
    return build.decoder(layers)


def tiny_config(model_type: str) -> Any:
    import transformers

    return transformers.OlmoeConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
