"""Tiny random ViT and DeiT image classifiers (2 layers, width 32, 32x32 images in 8x8 patches, 5 labels).

Their image processor resizes to 32x32 and normalizes to ``[-1, 1]``, as
ViT's checkpoints do at 224.  Weights are drawn at 10 times Hugging Face's
scale, so every one of them moves the logits.
"""

from __future__ import annotations

from typing import Any

#: The ``--config`` names: the model type and head of each.
NAMES = {"vit": "ViTForImageClassification", "deit": "DeiTForImageClassification"}

#: The images the tiny models take, ``(channels, height, width)``.
IMAGE = (3, 32, 32)


def tiny_config(name: str) -> Any:
    """The config of the tiny classifier ``name`` (:data:`NAMES`), its head in ``architectures``."""
    import transformers

    if name not in NAMES:
        raise ValueError(f"no tiny image classifier named {name!r}; the names are {', '.join(NAMES)}")
    auto = transformers.ViTConfig if name == "vit" else transformers.DeiTConfig
    channels, size, _ = IMAGE
    return auto(
        image_size=size, patch_size=8, num_channels=channels, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=5, initializer_range=0.2, architectures=[NAMES[name]],
    )


def tiny_processor(config: Any) -> Any:
    """A ``ViTImageProcessor`` (its PIL form: torchvision is not needed) to the tiny config's image size, normalizing
    to ``[-1, 1]``."""
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    return ViTImageProcessorPil(
        size={"height": config.image_size, "width": config.image_size}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
