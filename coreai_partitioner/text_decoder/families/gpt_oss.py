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

import torch
from torch import nn

from coreai_partitioner.blocks import Attention, MoE
from coreai_partitioner.text_decoder.families._tiny import tiny

MODEL_TYPES = ("gpt_oss",)


class SinkAttention(Attention):
    """Attention whose softmax rows also hold a sink logit per head (the SDPA composite's ``sinks`` input)."""

    def __init__(self, *args, sinks: nn.Parameter, **options) -> None:
        super().__init__(*args, **options)
        self.sinks = sinks

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.sdpa(q, keys, values, mask, self.sinks.to(q.dtype))


class Experts(MoE):
    """GPT-OSS's experts: a biased router whose top-k logits are softmaxed, experts stored ``[E, H, 2I]``
    (gate and up interleaved) and ``[E, I, H]`` with biases, and a clamped SwiGLU."""

    out_axis = 2

    def __init__(
        self, *, router_bias: nn.Parameter, gate_up_bias: nn.Parameter, down_bias: nn.Parameter, limit: float,
        alpha: float, **options,
    ) -> None:
        super().__init__(**options)
        self.router_bias, self.gate_up_bias, self.down_bias = router_bias, gate_up_bias, down_bias
        self.limit, self.alpha = limit, alpha

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, index = torch.topk(nn.functional.linear(x, self.router, self.router_bias), self.top_k, dim=-1)
        return torch.softmax(top, dim=-1), index.to(torch.int32)

    def glu(self, gate_up: torch.Tensor, dim: int) -> torch.Tensor:
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]  # interleaved along the last dim, clamped
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))

    def expert_outputs(self, tokens, pairs, gate_up, down) -> torch.Tensor:
        # Stored [E, in, out]: a token multiplies as a row (the experts gathered as the right operand).
        hidden = self.gather_up(tokens.unsqueeze(1), gate_up, rhs_indices=pairs)  # [N * k, 1, 2I]
        hidden = hidden + self.gate_up_bias.index_select(0, pairs).unsqueeze(1)
        out = self.gather_down(self.glu(hidden, -1), down, rhs_indices=pairs)  # [N * k, 1, H]
        return out + self.down_bias.index_select(0, pairs).unsqueeze(1)


def experts(mlp) -> Experts:
    router, experts = mlp.router, mlp.experts
    return Experts(
        router=router.weight,
        router_bias=router.bias,
        gate_up=experts.gate_up_proj,
        gate_up_bias=experts.gate_up_proj_bias,
        down=experts.down_proj,
        down_bias=experts.down_proj_bias,
        top_k=router.top_k,
        renormalize=False,
        limit=float(experts.limit),
        alpha=float(experts.alpha),
    )


def build(build):
    layers = [
        build.pre_norm_block(
            layer, build.attention(i, kind=SinkAttention, sinks=layer.self_attn.sinks), experts(layer.mlp), fp32_scale=True
        )
        for i, layer in enumerate(build.base.layers)
    ]
    return build.decoder(layers, norm=build.norm(build.base.norm, fp32_scale=True))


def tiny_config(model_type: str) -> Any:
    return tiny(
        "GptOssConfig", num_hidden_layers=2, intermediate_size=24, head_dim=16, num_local_experts=8,
        num_experts_per_tok=2, sliding_window=8,
        max_position_embeddings=131072,  # transformers 5.0.0rc1 derives YaRN's factor from it: 32 as 5.24's default
    )
