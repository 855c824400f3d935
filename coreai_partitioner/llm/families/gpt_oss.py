"""GPT-OSS: alternating sliding and full layers with attention sinks, and biased experts with a clamped SwiGLU.

Attention: q/k/v/o with biases, YaRN RoPE, and per-head sink logits that
join each row's softmax (the SDPA composite's ``sinks`` input).  The router
is a biased linear layer; its top ``num_experts_per_tok`` logits are
softmaxed.  Experts are stored ``[E, H, 2I]`` (gate and up interleaved)
and ``[E, I, H]`` with biases; ``gate`` is clamped from above and ``up``
both ways at ``swiglu_limit``, ``glu = gate * sigmoid(alpha * gate)``, and
the expert computes ``down((up + 1) * glu)``.  Norms multiply in fp32.
Composites: every RMSNorm, attention (sinks included) and RoPE, two
``gather_mm`` per layer.
"""

from __future__ import annotations

from typing import Any

from coreai_partitioner.llm.blocks import MoE
from coreai_partitioner.llm.families._tiny import tiny

MODEL_TYPES = ("gpt_oss",)


def experts(mlp) -> MoE:
    router, experts = mlp.router, mlp.experts
    return MoE(
        router=router.weight,
        router_bias=router.bias,
        gate_up=experts.gate_up_proj,
        gate_up_bias=experts.gate_up_proj_bias,
        down=experts.down_proj,
        down_bias=experts.down_proj_bias,
        transposed=True,
        top_k=router.top_k,
        routing="topk_softmax",
        limit=float(experts.limit),
        alpha=float(experts.alpha),
    )


def build(build):
    layers = [
        build.pre_norm_block(layer, build.attention(i, sinks=layer.self_attn.sinks), experts(layer.mlp), fp32_scale=True)
        for i, layer in enumerate(build.base.layers)
    ]
    return build.decoder(layers, norm=build.norm(build.base.norm, fp32_scale=True))


def tiny_config(model_type: str) -> Any:
    return tiny(
        "GptOssConfig", num_hidden_layers=2, intermediate_size=24, head_dim=16, num_local_experts=8,
        num_experts_per_tok=2, sliding_window=8,
        max_position_embeddings=131072,  # transformers 5.0.0rc1 derives YaRN's factor from it: 32 as 5.24's default
    )
