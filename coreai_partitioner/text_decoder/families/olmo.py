"""OLMo 2 and OLMo 3: norms after attention and after the MLP, and q/k normed over the whole projection.

``q_norm`` / ``k_norm`` norm ``q_proj`` / ``k_proj`` outputs over all heads
at once, before the split into heads and RoPE; each norm multiplies by its
weight in fp32 before the cast back (the ``rms_norm`` composite's fp32-scale
branch).  There is no input norm: ``h = x + post_attention_layernorm(attn(x))``,
then ``h + post_feedforward_layernorm(mlp(h))``.  OLMo 3 adds sliding layers
(``config.layer_types``: three sliding, one full) and, on transformers 5.x,
a RoPE table per layer type.  Composites: every RMSNorm, every attention,
RoPE on q and k.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coreai_partitioner.blocks import Attention
from coreai_partitioner.text_decoder.families._tiny import tiny

MODEL_TYPES = ("olmo2", "olmo3")


class WholeProjectionNormAttention(Attention):
    """Attention whose ``q_norm`` and ``k_norm`` norm the whole q and k projections, all heads at once,
    before the split into heads (OLMo 2, OLMo 3, OLMoE)."""

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q_norm(self.q(x)), self.k_norm(self.k(x)), self.v(x)

    def heads(self, t: torch.Tensor, norm: nn.Module | None = None) -> torch.Tensor:
        return super().heads(t)  # normed already, over every head at once (project)


def build(build):
    ropes = build.layer_ropes()  # OLMo 3 on transformers 5.24: one table per layer type
    layers = []
    for i, layer in enumerate(build.base.layers):
        attn = layer.self_attn
        attention = build.attention(
            i,
            q_norm=build.norm(attn.q_norm, fp32_scale=True),
            k_norm=build.norm(attn.k_norm, fp32_scale=True),
            kind=WholeProjectionNormAttention,
            rope=ropes[i],
        )
        layers.append(
            build.block(
                attention,
                build.mlp(layer.mlp),
                post_attn=build.norm(layer.post_attention_layernorm, fp32_scale=True),
                post_mlp=build.norm(layer.post_feedforward_layernorm, fp32_scale=True),
            )
        )
    return build.decoder(layers, norm=build.norm(build.base.norm, fp32_scale=True))


def tiny_config(model_type: str) -> Any:
    if model_type == "olmo2":
        return tiny("Olmo2Config", num_hidden_layers=4, attention_bias=True)
    if model_type == "olmo3":
        return tiny("Olmo3Config", num_hidden_layers=4, sliding_window=8)
    raise KeyError(model_type)
