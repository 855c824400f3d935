"""LFM2: short-convolution layers beside full attention.

``config.layer_types`` says which layers are ``conv`` (:class:`ShortConv`:
``out_proj(C * conv(B * x))``, the causal conv continuing from a state the
delegate owns) and which attention (q and k normed per head; the output
projection is ``out_proj``).  Norms: ``operator_norm`` before the mixer,
``ffn_norm`` before the MLP (``w2(silu(w1(x)) * w3(x))``), ``embedding_norm``
last.  Composites: every RMSNorm, attention and RoPE; the convolutions are
plain ops (no composite computes them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coreai_partitioner.blocks import GatedMLP
from coreai_partitioner.blocks.recurrent import Recurrent, causal_conv
from coreai_partitioner.text_decoder.families._tiny import tiny

MODEL_TYPES = ("lfm2",)


class ShortConv(Recurrent):
    """LFM2's short convolution: ``out_proj(C * conv(B * x))``, the causal conv continuing from ``conv_state``."""

    def __init__(self, module: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module  # HF's: in_proj, conv, out_proj
        channels, _, kernel = module.conv.weight.shape
        self.register_buffer("conv_state", torch.zeros(1, channels, kernel - 1, dtype=dtype), persistent=False)

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        m = self.module
        gate, carry, value = m.in_proj(x).transpose(-1, -2).chunk(3, dim=-2)
        out = carry * causal_conv(m.conv, self.conv_state, gate * value, step, self.stash("conv_state"))
        return m.out_proj(out.transpose(-1, -2))


def build(build):
    config = build.config
    layers = []
    for i, layer in enumerate(build.base.layers):
        if hasattr(layer, "conv"):
            mixer = ShortConv(layer.conv, build.dtype)
            build.keep_plain(f"model.layers.{i}.conv", "a short causal convolution: no composite computes it")
        else:
            attn = layer.self_attn
            mixer = build.attention(
                i, o=attn.out_proj, q_norm=build.norm(attn.q_layernorm), k_norm=build.norm(attn.k_layernorm)
            )
        ff = layer.feed_forward
        mlp = GatedMLP(getattr(config, "hidden_act", "silu"), gate=ff.w1, up=ff.w3, down=ff.w2)
        layers.append(build.block(mixer, mlp, pre_attn=build.norm(layer.operator_norm), pre_mlp=build.norm(layer.ffn_norm)))
    return build.decoder(layers, norm=build.norm(build.base.embedding_norm))


def tiny_config(model_type: str) -> Any:
    return tiny(
        "Lfm2Config",
        tie_word_embeddings=None,  # tied by default
        num_hidden_layers=4,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        conv_L_cache=3,
        block_multiple_of=16,
        block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=True,
    )
