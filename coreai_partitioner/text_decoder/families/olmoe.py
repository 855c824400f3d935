"""OLMoE: pre-norm layers, q and k normed over the whole projection, a mixture-of-experts MLP in every layer.

The router takes a softmax over the experts, then the top
``num_experts_per_tok`` (renormalized only with ``norm_topk_prob``).
``clip_qkv`` would clamp q, k and v after their norms; it is not adapted.
Composites: every RMSNorm, attention and RoPE, two ``gather_mm`` per layer.
"""

from __future__ import annotations

from typing import Any

from coreai_partitioner.text_decoder.families._tiny import tiny
from coreai_partitioner.text_decoder.families.olmo import WholeProjectionNormAttention

MODEL_TYPES = ("olmoe",)


def build(build):
    config = build.config
    if getattr(config, "clip_qkv", None) is not None:
        raise build.refuse("clip_qkv", config.clip_qkv, "None (clamping q, k and v is not adapted)")
    layers = []
    for i, layer in enumerate(build.base.layers):
        attn = layer.self_attn
        norms = dict(q_norm=build.norm(attn.q_norm), k_norm=build.norm(attn.k_norm), kind=WholeProjectionNormAttention)
        mlp = build.moe(layer.mlp, renormalize=config.norm_topk_prob)
        layers.append(build.pre_norm_block(layer, build.attention(i, **norms), mlp))
    return build.decoder(layers)


def tiny_config(model_type: str) -> Any:
    return tiny(
        "OlmoeConfig", num_hidden_layers=2, intermediate_size=24, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=False,
    )
