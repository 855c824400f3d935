"""Mixtral: Mistral's layers with a mixture-of-experts MLP in every layer, through ``gather_mm``.

The router takes a softmax over the experts, then the top
``num_experts_per_tok``, always renormalized; ``intermediate_size`` is each
expert's width.  Sliding windows as Mistral's.  Composites: every RMSNorm,
attention and RoPE, two ``gather_mm`` per layer.
"""

from __future__ import annotations

from typing import Any

from coreai_partitioner.text_decoder.families._tiny import tiny

MODEL_TYPES = ("mixtral",)


def build(build):
    layers = [
        build.pre_norm_block(layer, build.attention(i), build.moe(layer.mlp, renormalize=True))
        for i, layer in enumerate(build.base.layers)
    ]
    return build.decoder(layers)


def tiny_config(model_type: str) -> Any:
    return tiny(
        "MixtralConfig", num_hidden_layers=2, intermediate_size=24, head_dim=16, num_local_experts=8,
        num_experts_per_tok=2, sliding_window=8,
    )
