"""What every vision family's tiny config starts from: a 2-layer tower on 32x32 images, and a one-character tokenizer."""

from __future__ import annotations

from typing import Any

from coreai_partitioner.text_decoder.multimodal import tiny_tokenizer as tokenizer

__all__ = ["IMAGE_TOKEN_ID", "TOWER", "text_config", "tokenizer"]

#: A tower of 2 layers, width 32, over 32x32 images in 8x8 patches (16 patches).
TOWER = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2, image_size=32, patch_size=8)

#: Where the tiny configs put their image placeholder and the tokens around it (inside the 256-token vocabulary).
IMAGE_TOKEN_ID = 250


def text_config(model_type: str, **overrides: Any) -> Any:
    """The text-decoder family's tiny text config for ``model_type``, cut to 2 layers."""
    from coreai_partitioner.text_decoder import first_layers, tiny_config

    config = tiny_config(model_type)
    if config.num_hidden_layers > 2:
        config = first_layers(config, 2)
    for name, value in overrides.items():
        setattr(config, name, value)
    return config
