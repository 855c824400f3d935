"""SmolLM3: Llama's layers, with RoPE left out of the layers ``config.no_rope_layers`` marks 0 (NoPE).

Only NoPE layers slide (``config.layer_types``).  Composites: every RMSNorm,
every attention, RoPE on q and k of the RoPE layers.
"""

from __future__ import annotations

from typing import Any

from coreai_partitioner.text_decoder.families._tiny import tiny

MODEL_TYPES = ("smollm3",)


def build(build):
    uses_rope = build.config.no_rope_layers
    layers = [
        build.pre_norm_block(layer, build.attention(i, rope="default" if uses_rope[i] else None))
        for i, layer in enumerate(build.base.layers)
    ]
    return build.decoder(layers)


def tiny_config(model_type: str) -> Any:
    return tiny(
        "SmolLM3Config", num_hidden_layers=4, no_rope_layers=[1, 0, 1, 0], use_sliding_window=True, sliding_window=8,
        tie_word_embeddings=True,
    )
