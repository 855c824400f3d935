"""Phi-3 and Phi-4-mini: Llama's layers over fused projections, partial RoPE, LongRoPE.

``qkv_proj`` is split into q, k, v and ``gate_up_proj`` into gate and up
(in that order).  RoPE rotates the first ``partial_rotary_factor`` of each
head (the ``rope`` composite's ``dims``).  LongRoPE picks the long factors
for a call whose last position is past ``original_max_position_embeddings``,
as HF's forward does; keys already cached keep the factors they were
rotated with (HF's ``generate`` instead recomputes the whole sequence when a
decode step crosses that length).  Composites: every RMSNorm, every
attention, RoPE on q and k.
"""

from __future__ import annotations

from typing import Any

from coreai_partitioner.llm.families._tiny import tiny

MODEL_TYPES = ("phi3",)


def build(build):
    return build.decoder([build.pre_norm_block(layer, build.attention(i)) for i, layer in enumerate(build.base.layers)])


def tiny_config(model_type: str) -> Any:
    longrope = {"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.5], "long_factor": [1.0, 2.0, 4.0, 8.0]}
    return tiny(
        "Phi3Config", num_hidden_layers=2, max_position_embeddings=64, original_max_position_embeddings=16,
        partial_rotary_factor=0.5, rope_scaling=longrope,
    )
