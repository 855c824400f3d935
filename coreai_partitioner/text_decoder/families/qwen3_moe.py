"""Qwen3-MoE: Qwen3's attention (q and k normed per head), and mixture-of-experts MLPs through ``gather_mm``.

A layer's MLP is sparse unless ``config.mlp_only_layers`` lists it or
``decoder_sparse_step`` skips it (HF builds the layer's module either way;
this follows the module).  The router takes a softmax over the experts,
then the top ``num_experts_per_tok``, renormalized when ``norm_topk_prob``.
Norms multiply by their weight in fp32 before the cast back.  Composites:
every RMSNorm, attention and RoPE, and two ``gather_mm`` per sparse layer.
"""

from __future__ import annotations

from typing import Any

from coreai_partitioner.text_decoder.families._tiny import tiny

MODEL_TYPES = ("qwen3_moe",)


def build(build):
    layers = []
    for i, layer in enumerate(build.base.layers):
        attn = layer.self_attn
        norms = dict(q_norm=build.norm(attn.q_norm, fp32_scale=True), k_norm=build.norm(attn.k_norm, fp32_scale=True))
        mlp = build.moe(layer.mlp, renormalize=build.config.norm_topk_prob) if hasattr(layer.mlp, "experts") else None
        layers.append(build.pre_norm_block(layer, build.attention(i, **norms), mlp, fp32_scale=True))
    return build.decoder(layers, norm=build.norm(build.base.norm, fp32_scale=True))


def tiny_config(model_type: str) -> Any:
    return tiny(
        "Qwen3MoeConfig", num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=24, head_dim=16,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1], use_sliding_window=True,
        sliding_window=8,
    )
