"""SmolLM3: Llama's layers, with RoPE left out of the layers ``config.no_rope_layers`` marks 0 (NoPE).

Only NoPE layers slide (``config.layer_types``).  Composites: every RMSNorm,
every attention, RoPE on q and k of the RoPE layers.
"""

from __future__ import annotations

from typing import Any

MODEL_TYPES = ("smollm3",)


def build(build):
    uses_rope = build.config.no_rope_layers
    layers = []
    for i, layer in enumerate(build.base.layers):
        attention = build.attention(
            f"model.layers.{i}.self_attn", layer.self_attn, i, rope="default" if uses_rope[i] else None
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

    return transformers.SmolLM3Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        no_rope_layers=[1, 0, 1, 0],
        use_sliding_window=True,
        sliding_window=8,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
