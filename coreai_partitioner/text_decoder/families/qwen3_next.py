"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE (text): gated delta-rule layers beside gated full attention.

``config.layer_types`` alternates ``linear_attention`` (:class:`~coreai_partitioner.blocks.GatedDeltaNet`:
a causal conv and the ``gated_delta_update`` composite over a recurrent
state the delegate owns) and ``full_attention`` (q's projection is twice
as wide, query and a sigmoid output gate per head; q and k normed per head;
RoPE on the first ``partial_rotary_factor`` of each head).  Layer, final
and q/k norms scale by ``1 + weight``; the delta rule's gated norm by its
weight.  MLPs are dense (Qwen3.5) or mixtures of experts with a shared
expert behind a sigmoid gate (Qwen3-Next, Qwen3.5-MoE), through
``gather_mm``.  Qwen3-Next's ``in_proj_qkvz`` / ``in_proj_ba`` are grouped
by key head (:class:`GroupedGatedDeltaNet`), Qwen3.5's projections are separate.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coreai_partitioner.blocks import Attention, GatedDeltaNet, MoE
from coreai_partitioner.text_decoder.families._tiny import tiny

MODEL_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


class GatedAttention(Attention):
    """Attention with an output gate: ``q``'s projection holds, per head, the query and then a gate, and the
    attention is multiplied by ``sigmoid(gate)`` before ``o``."""

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        h, d = self.shape.heads, self.shape.head_dim
        q, gate = self.q(x).view(*x.shape[:-1], h, 2 * d).chunk(2, dim=-1)
        q, gate = q.reshape(*x.shape[:-1], h * d), gate.reshape(*x.shape[:-1], h * d)
        out = self.attend_heads(q, self.k(x), self.v(x), step)
        return self.o(out * torch.sigmoid(gate))


class SharedExpertMoE(MoE):
    """Routed experts plus a dense MLP every token also takes, scaled by ``sigmoid(shared_gate(x))``."""

    def __init__(self, *, shared: nn.Module, shared_gate: nn.Module, **options) -> None:
        super().__init__(**options)
        self.shared, self.shared_gate = shared, shared_gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        shared = torch.sigmoid(self.shared_gate(flat)) * self.shared(flat)
        return (super().forward(x).reshape(flat.shape) + shared).view(x.shape)


class GroupedGatedDeltaNet(GatedDeltaNet):
    """Qwen3-Next's delta rule: ``in_proj_qkvz`` and ``in_proj_ba`` grouped by key head, split as HF splits them."""

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        m, (hk, hv), (dk, dv) = self.module, self.heads, self.dims
        batch, length = x.shape[0], x.shape[1]
        r = hv // hk
        qkvz = m.in_proj_qkvz(x).view(batch, length, hk, 2 * dk + 2 * r * dv)
        q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=3)
        b, a = torch.split(m.in_proj_ba(x).view(batch, length, hk, 2 * r), [r, r], dim=3)
        mixed = torch.cat([q.reshape(batch, length, -1), k.reshape(batch, length, -1), v.reshape(batch, length, -1)], -1)
        z = z.reshape(batch, length, hv, dv)
        return mixed.transpose(1, 2), z, b.reshape(batch, length, hv), a.reshape(batch, length, hv)


def build(build):
    config = build.config
    renormalize = getattr(config, "norm_topk_prob", True)
    layers = []
    for i, layer in enumerate(build.base.layers):
        if hasattr(layer, "linear_attn"):
            grouped = hasattr(layer.linear_attn, "in_proj_qkvz")
            mixer = (GroupedGatedDeltaNet if grouped else GatedDeltaNet)(layer.linear_attn, build.dtype)
        else:
            attn = layer.self_attn
            mixer = build.attention(
                i,
                q_norm=build.norm(attn.q_norm, plus_one=True),
                k_norm=build.norm(attn.k_norm, plus_one=True),
                kind=GatedAttention,
            )
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            mlp = build.moe(
                mlp, renormalize=renormalize, kind=SharedExpertMoE, shared=build.mlp(mlp.shared_expert),
                shared_gate=mlp.shared_expert_gate,
            )
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
