"""Gemma, Gemma 2 and Gemma 3 (text): ``(1 + w)`` norms, a scaled embedding, local and global layers.

Every RMSNorm scales by ``1 + weight``, computed in fp32 (the ``rms_norm``
composite's branch for an fp32 scale).  The embedding is multiplied by
``sqrt(hidden_size)`` in the model's dtype.  Gemma 2 and 3 wrap attention
and MLP in four norms (``input``, ``post_attention``, ``pre_feedforward``,
``post_feedforward``), scale queries by ``query_pre_attn_scalar ** -0.5``
and alternate sliding and full layers (``config.layer_types``).  Gemma 2
soft-caps the attention logits (that attention stays plain ops: the SDPA
composite has no soft-capping) and the final logits; Gemma 3 norms q and k
per head and keeps a RoPE table per layer type (``rope_parameters`` keyed by
``sliding_attention`` / ``full_attention``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from coreai_partitioner.blocks import Attention
from coreai_partitioner.text_decoder.families._tiny import tiny

logger = logging.getLogger(__name__)

MODEL_TYPES = ("gemma", "gemma2", "gemma3_text")


class SoftcappedAttention(Attention):
    """Gemma 2's attention: logits soft-capped, ``tanh(s / cap) * cap``, in plain ops.

    The SDPA composite has no soft-capping, so this attention is plain ops
    (the decoder lists it with the reason); RoPE and the cache are the
    composites' and the step's as for any layer.
    """

    def __init__(self, *args, softcap: float, **options) -> None:
        super().__init__(*args, **options)
        self.softcap = softcap
        self.sdpa = None
        #: Why this attention is plain ops instead of the SDPA composite.
        self.plain_reason = f"its logits are soft-capped at {softcap}; the SDPA composite has no soft-capping"
        logger.info("%s attention stays plain ops: %s", self.path, self.plain_reason)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        groups = q.shape[1] // keys.shape[1]
        if groups > 1:  # by index, as the SDPA composite does: expand + reshape over a symbolic T trips torch.export
            heads = torch.arange(keys.shape[1], device=keys.device).repeat_interleave(groups)
            keys, values = keys.index_select(1, heads), values.index_select(1, heads)
        scores = torch.matmul(q, keys.transpose(2, 3)) * self.scale
        scores = torch.tanh(scores / self.softcap) * self.softcap
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(weights, values)


def build(build):
    config = build.config
    base = build.base
    ropes = build.layer_ropes()
    softcap = getattr(config, "attn_logit_softcapping", None) if build.model_type == "gemma2" else None
    layers = []
    for i, layer in enumerate(base.layers):
        attn = layer.self_attn
        norms = {}
        if hasattr(attn, "q_norm"):
            norms = dict(q_norm=build.norm(attn.q_norm, plus_one=True), k_norm=build.norm(attn.k_norm, plus_one=True))
        if softcap is not None:
            norms.update(kind=SoftcappedAttention, softcap=softcap)
        attention = build.attention(i, rope=ropes[i], **norms)
        if build.model_type == "gemma":
            around = dict(
                pre_attn=build.norm(layer.input_layernorm, plus_one=True),
                pre_mlp=build.norm(layer.post_attention_layernorm, plus_one=True),
            )
        else:
            around = dict(
                pre_attn=build.norm(layer.input_layernorm, plus_one=True),
                post_attn=build.norm(layer.post_attention_layernorm, plus_one=True),
                pre_mlp=build.norm(layer.pre_feedforward_layernorm, plus_one=True),
                post_mlp=build.norm(layer.post_feedforward_layernorm, plus_one=True),
            )
        layers.append(build.block(attention, build.mlp(layer.mlp), **around))
    # transformers 5.24's scaled embedding module multiplies by sqrt(hidden) itself; 5.0's Gemma and Gemma 2 do it after.
    scaled = hasattr(base.embed_tokens, "embed_scale")
    return build.decoder(
        layers,
        norm=build.norm(base.norm, plus_one=True),
        embed_scale=None if scaled else config.hidden_size**0.5,
        final_softcap=getattr(config, "final_logit_softcapping", None),
    )


def tiny_config(model_type: str) -> Any:
    common = dict(head_dim=16, tie_word_embeddings=None)  # Gemma ties by default
    alternating = dict(num_hidden_layers=4, sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2)
    if model_type == "gemma":
        return tiny("GemmaConfig", num_hidden_layers=2, **common)
    if model_type == "gemma2":
        return tiny(
            "Gemma2Config", **alternating, query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0, **common,
        )
    if model_type == "gemma3_text":
        rope = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
        }
        return tiny(
            "Gemma3TextConfig", **alternating, query_pre_attn_scalar=16, rope_parameters=rope,
            final_logit_softcapping=3.0, **common,
        )
    raise KeyError(model_type)
