"""Qwen3: Llama's layers with an RMSNorm on each head of q and k (``q_norm``, ``k_norm``) before RoPE.

Composites: every RMSNorm (q and k norms included), every attention, RoPE
on q and k.  Sliding layers where ``config.layer_types`` says so.
"""

from __future__ import annotations

from typing import Any

from coreai_partitioner.text_decoder.families._tiny import tiny

MODEL_TYPES = ("qwen3",)


def build(build):
    layers = []
    for i, layer in enumerate(build.base.layers):
        attn = layer.self_attn
        attention = build.attention(i, q_norm=build.norm(attn.q_norm), k_norm=build.norm(attn.k_norm))
        layers.append(build.pre_norm_block(layer, attention))
    return build.decoder(layers)


def tiny_config(model_type: str) -> Any:
    return tiny(
        "Qwen3Config", num_hidden_layers=2, head_dim=16, use_sliding_window=True, sliding_window=8, max_window_layers=1
    )
