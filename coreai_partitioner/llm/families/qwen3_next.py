"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE (text): gated delta-rule layers beside gated full attention.

``config.layer_types`` alternates ``linear_attention`` (:class:`~..blocks.GatedDeltaNet`:
a causal conv and the ``gated_delta_update`` composite over a recurrent
state the delegate owns) and ``full_attention`` (q's projection is twice
as wide, query and a sigmoid output gate per head; q and k normed per head;
RoPE on the first ``partial_rotary_factor`` of each head).  Layer, final
and q/k norms scale by ``1 + weight``; the delta rule's gated norm by its
weight.  MLPs are dense (Qwen3.5) or mixtures of experts with a shared
expert behind a sigmoid gate (Qwen3-Next, Qwen3.5-MoE), through
``gather_mm``.  Qwen3-Next's ``in_proj_qkvz`` / ``in_proj_ba`` are grouped
by key head, Qwen3.5's projections are separate; the block reads either.
"""

from __future__ import annotations

from typing import Any

from coreai_partitioner.llm.families._tiny import tiny

MODEL_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


def build(build):
    from coreai_partitioner.llm.blocks import GatedDeltaNet

    config = build.config
    routing = "softmax_topk_renorm" if getattr(config, "norm_topk_prob", True) else "softmax_topk"
    layers = []
    for i, layer in enumerate(build.base.layers):
        if hasattr(layer, "linear_attn"):
            mixer = GatedDeltaNet(layer.linear_attn, build.dtype)
        else:
            attn = layer.self_attn
            mixer = build.attention(
                i,
                q_norm=build.norm(attn.q_norm, plus_one=True),
                k_norm=build.norm(attn.k_norm, plus_one=True),
                output_gate=True,
            )
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            mlp = build.moe(mlp, routing, shared=build.mlp(mlp.shared_expert), shared_gate=mlp.shared_expert_gate)
        else:
            mlp = None
        layers.append(build.pre_norm_block(layer, mixer, mlp, plus_one=True))
    return build.decoder(layers, norm=build.norm(build.base.norm, plus_one=True))


def tiny_config(model_type: str) -> Any:
    common = dict(
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
    )
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    if model_type == "qwen3_next":
        return tiny("Qwen3NextConfig", **common, **experts, decoder_sparse_step=1, mlp_only_layers=[0])
    if model_type == "qwen3_5_text":
        return tiny("Qwen3_5TextConfig", **common)
    if model_type == "qwen3_5_moe_text":
        return tiny("Qwen3_5MoeTextConfig", **common, **experts, intermediate_size=None)
    raise KeyError(model_type)
