"""Llama, and the families whose math is Llama's: Mistral, Ministral and Ministral 3, Qwen2.

Pre-norm layers: ``input_layernorm``, attention (q/k/v/o projections, GQA,
RoPE, a sliding window where ``config.layer_types`` says so or, Mistral's
way, on every layer when ``config.sliding_window`` is set), then
``post_attention_layernorm`` and the gated MLP.  Qwen2 has q/k/v biases (the
projections carry them).  Ministral 3 scales queries by position after RoPE
(``rope_parameters['llama_4_scaling_beta']``).  Composites: every RMSNorm,
every attention, RoPE on q and k.
"""

from __future__ import annotations

from typing import Any

import torch

from coreai_partitioner.blocks import Attention
from coreai_partitioner.text_decoder.families._tiny import tiny

MODEL_TYPES = ("llama", "mistral", "ministral", "ministral3", "qwen2")


class PositionScaledAttention(Attention):
    """Ministral 3's attention: queries scaled by ``1 + beta * log(1 + floor(position / original))`` after RoPE.

    ``beta`` is ``rope_parameters['llama_4_scaling_beta']``, ``original`` its
    ``original_max_position_embeddings``; the scale is made once per call.
    """

    def __init__(self, *args, beta: float, original: int, **options) -> None:
        super().__init__(*args, **options)
        self.beta, self.original = float(beta), int(original)

    def query(self, q: torch.Tensor, step) -> torch.Tensor:
        def make() -> torch.Tensor:
            blocks = torch.floor(step.positions.float() / float(self.original))
            return (1.0 + self.beta * torch.log(1.0 + blocks)).view(1, 1, -1, 1)

        scale = step.memoized(("position_scale", self.beta, self.original), make)
        return super().query(q, step) * scale.to(q.dtype)


def build(build):
    options = {}
    if build.model_type == "ministral3":
        rope = build.config.rope_parameters
        options = dict(
            kind=PositionScaledAttention, beta=rope["llama_4_scaling_beta"], original=rope["original_max_position_embeddings"]
        )
    layers = [build.pre_norm_block(layer, build.attention(i, **options)) for i, layer in enumerate(build.base.layers)]
    return build.decoder(layers)


def tiny_config(model_type: str) -> Any:
    if model_type == "llama":
        return tiny("LlamaConfig", num_hidden_layers=2)
    if model_type == "mistral":
        return tiny("MistralConfig", num_hidden_layers=2, sliding_window=8)
    if model_type == "ministral":
        layer_types = ["sliding_attention", "full_attention"]
        return tiny("MinistralConfig", num_hidden_layers=2, head_dim=16, sliding_window=8, layer_types=layer_types)
    if model_type == "ministral3":
        rope = {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1,
        }
        return tiny(
            "Ministral3Config", num_hidden_layers=2, head_dim=16, sliding_window=8, rope_parameters=rope,
            max_position_embeddings=64, pad_token_id=11,
        )
    if model_type == "qwen2":
        return tiny("Qwen2Config", num_hidden_layers=2, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    raise KeyError(model_type)
