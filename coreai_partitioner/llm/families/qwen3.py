"""Qwen3: Llama's layers with an RMSNorm on each head of q and k (``q_norm``, ``k_norm``) before RoPE.

Composites: every RMSNorm (q and k norms included), every attention, RoPE
on q and k.  Sliding layers where ``config.layer_types`` says so.
"""

from __future__ import annotations

from typing import Any

MODEL_TYPES = ("qwen3",)


def build(build):
    layers = []
    for i, layer in enumerate(build.base.layers):
        attn = layer.self_attn
        attention = build.attention(
            f"model.layers.{i}.self_attn", attn, i, q_norm=build.norm(attn.q_norm), k_norm=build.norm(attn.k_norm)
        )
        layers.append(
            build.block(
                attention,
                build.mlp(layer.mlp),
                pre_attn=build.norm(layer.input_layernorm),
                pre_mlp=build.norm(layer.post_attention_layernorm),
            )
        )
    return build.decoder(layers)


def tiny_config(model_type: str) -> Any:
    import transformers

    return transformers.Qwen3Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=1,
    )
