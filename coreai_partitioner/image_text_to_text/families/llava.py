"""LLaVA: a CLIP or SigLIP tower whose earlier layer feeds an MLP projector, and any text decoder a text-decoder family adapts.

HF takes the tower's ``hidden_states[vision_feature_layer]`` (the
penultimate layer, ``-2``, by default; a list of layers is concatenated
along the width), so the exported tower stops after the last layer it
needs, without the final LayerNorm (:class:`SelectedLayers`).  With
``vision_feature_select_strategy="default"`` the first token (CLIP's class
token) is dropped, as HF drops it; ``"full"`` keeps it.  The projector is
HF's own ``multi_modal_projector`` (Linear, activation, Linear).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coreai_partitioner.image_text_to_text.families import _tiny
from coreai_partitioner.image_text_to_text.model import TextModel, VisionLanguage
from coreai_partitioner.image_text_to_text.tower import VisionTower, tower

MODEL_TYPES = ("llava",)

#: The towers whose layers :func:`~coreai_partitioner.image_text_to_text.tower.tower` reads.
TOWERS = ("clip_vision_model", "siglip_vision_model")


class SelectedLayers(VisionTower):
    """A tower giving the outputs of some of its layers (HF's ``hidden_states[i]``, 0 the embeddings), concatenated,
    its first token dropped with ``drop_first``."""

    def __init__(self, tower: VisionTower, indices: list[int], drop_first: bool) -> None:
        super().__init__(tower.embeddings, list(tower.layers), pre_norm=tower.pre_norm)
        self.indices = indices
        self.drop_first = drop_first

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        hidden = self.embeddings(pixels)
        if self.pre_norm is not None:
            hidden = self.pre_norm(hidden)
        states = [hidden]
        for layer in self.layers:
            states.append(layer(states[-1]))
        selected = torch.cat([states[i] for i in self.indices], dim=-1)
        return selected[:, 1:] if self.drop_first else selected


def feature_layers(config: Any) -> list[int]:
    """``vision_feature_layer`` as indices of HF's ``hidden_states`` (0 the embeddings, ``i`` layer ``i``'s output)."""
    layer = config.vision_feature_layer
    count = config.vision_config.num_hidden_layers
    return [i if i >= 0 else count + 1 + i for i in (layer if isinstance(layer, (list, tuple)) else [layer])]


def image_tokens(config: Any) -> int:
    vision = config.vision_config
    patches = (vision.image_size // vision.patch_size) ** 2
    cls = 1 if vision.model_type == "clip_vision_model" else 0
    return patches + cls - (1 if config.vision_feature_select_strategy == "default" else 0)


def check(config: Any, shapes: Any) -> None:
    """A tower this file reads, feature layers it has, a selection strategy HF knows."""
    from coreai_partitioner.image_text_to_text.errors import UnsupportedVisionConfig

    vision = config.vision_config
    if vision.model_type not in TOWERS:
        raise UnsupportedVisionConfig(config.model_type, "vision_config.model_type", vision.model_type, f"one of {', '.join(TOWERS)}")
    count = vision.num_hidden_layers
    if not all(0 <= i <= count for i in feature_layers(config)):
        raise UnsupportedVisionConfig(
            config.model_type, "vision_feature_layer", config.vision_feature_layer, f"layers of a {count}-layer tower (-{count + 1} to {count})"
        )
    if config.vision_feature_select_strategy not in ("default", "full"):
        raise UnsupportedVisionConfig(
            config.model_type, "vision_feature_select_strategy", config.vision_feature_select_strategy, "'default' or 'full'"
        )


def build(model: nn.Module, shapes: Any) -> VisionLanguage:
    from coreai_partitioner.text_decoder import adapt

    config = model.config
    base = model.model
    vision = config.vision_config
    indices = feature_layers(config)
    kept = tower(base.vision_tower, vision, layers=max(indices), post_norm=False)
    text = TextModel(config.get_text_config(), base.language_model, model.lm_head)
    return VisionLanguage.of_config(
        config,
        tower=SelectedLayers(kept, indices, drop_first=config.vision_feature_select_strategy == "default"),
        projector=base.multi_modal_projector,
        decoder=adapt(text, shapes),
        image_tokens=image_tokens(config),
    )


def tiny_config(model_type: str) -> Any:
    from transformers import CLIPVisionConfig, LlavaConfig

    text = _tiny.text_config("llama")
    vision = CLIPVisionConfig(**_tiny.TOWER, projection_dim=32, hidden_act="quick_gelu")
    return LlavaConfig(
        text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_index=_tiny.IMAGE_TOKEN_ID,
        vision_feature_layer=-2, vision_feature_select_strategy="default", projector_hidden_act="gelu",
    )


def tiny_processor(config: Any) -> Any:
    """LLaVA's processor (CLIP's image processor at the tower's size) over a one-character tokenizer."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    size = config.vision_config.image_size
    return LlavaProcessor(
        image_processor=CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size}),
        tokenizer=_tiny.tokenizer(config, {config.image_token_id: "<image>"}, image_token="<image>"),
        patch_size=config.vision_config.patch_size,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
        num_additional_image_tokens=1,
        image_token="<image>",
    )
