"""SmolVLM and Idefics3: a SigLIP tower at one image size, a pixel-shuffle connector, a Llama text decoder.

The tower is SigLIP's with Idefics3's patch position ids, which HF computes
per image from its ``pixel_attention_mask`` with ``unfold`` and
``bucketize`` over fractional coordinates (neither is a Core AI op).  The
processor hands the tower whole tiles of ``max_image_size`` (a padded one
appears only in a batch of images of different sizes), so the ids are
those of a full ``image_size`` grid: read once off HF's own embedding code
at export (:func:`~coreai_partitioner.image_text_to_text.tower.position_ids_of`) and
stored as a constant.  The connector is HF's own (``pixel_shuffle`` by
``scale_factor``, then ``modality_projection``): reshapes and permutes of
static shapes, and a Linear.

**Tiles.**  The processor splits a large image into a grid of
``max_image_size`` tiles plus one global view of the whole image, each of
``image_seq_len`` tokens, with text tokens between them
(``<fake_token_around_image><row_1_col_2>``, ``<global-img>``).  HF runs
each tile through the tower on its own, so each tile is one runner image
input: the prompt becomes text, tile, text, tile, ..., global image, text,
in the processor's order (:func:`coreai_partitioner.image_text_to_text.run.runner_inputs`).
With ``do_image_splitting=False`` the processor gives the global image alone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coreai_partitioner.image_text_to_text.families import _tiny
from coreai_partitioner.image_text_to_text.model import TextModel, VisionLanguage
from coreai_partitioner.image_text_to_text.tower import tower

MODEL_TYPES = ("idefics3", "smolvlm")


def image_tokens(config: Any) -> int:
    vision = config.vision_config
    return (vision.image_size // vision.patch_size) ** 2 // config.scale_factor**2


def check(config: Any, shapes: Any) -> None:
    """The patch grid must pixel-shuffle by ``scale_factor`` (HF assumes it too)."""
    from coreai_partitioner.image_text_to_text.errors import UnsupportedVisionConfig

    vision = config.vision_config
    side = vision.image_size // vision.patch_size
    if side % config.scale_factor:
        raise UnsupportedVisionConfig(
            config.model_type, "scale_factor", config.scale_factor,
            f"a divisor of the patch grid's side ({side} = image_size {vision.image_size} // patch_size {vision.patch_size})",
        )


def build(model: nn.Module, shapes: Any) -> VisionLanguage:
    from coreai_partitioner.text_decoder import adapt

    config = model.config
    base = model.model
    vision = config.vision_config
    side = vision.image_size // vision.patch_size
    hf_tower = base.vision_model
    every_patch = torch.ones(1, side, side, dtype=torch.bool)
    text = TextModel(config.get_text_config(), base.text_model, model.lm_head)
    return VisionLanguage.of_config(
        config,
        tower=tower(
            hf_tower, vision, embed=lambda pixels: hf_tower.embeddings(pixel_values=pixels, patch_attention_mask=every_patch),
            path="vision_model",
        ),
        projector=base.connector,
        decoder=adapt(text, shapes),
        image_tokens=image_tokens(config),
    )


def tiny_config(model_type: str) -> Any:
    import transformers

    text = _tiny.text_config("llama")
    kind = {"idefics3": ("Idefics3Config", "Idefics3VisionConfig"), "smolvlm": ("SmolVLMConfig", "SmolVLMVisionConfig")}
    config_class, vision_class = (getattr(transformers, name) for name in kind[model_type])
    vision = vision_class(**_tiny.TOWER, hidden_act="gelu_pytorch_tanh")
    return config_class(
        text_config=text.to_dict(), vision_config=vision.to_dict(), scale_factor=2, image_token_id=_tiny.IMAGE_TOKEN_ID,
        tie_word_embeddings=False,
    )


#: Idefics3's processor's special tokens, at the ids of the tiny vocabulary after the image token.
_SPECIAL = ("<fake_token_around_image>", "<global-img>", "<end_of_utterance>") + tuple(
    f"<row_{r}_col_{c}>" for r in (1, 2) for c in (1, 2)
)


def tiny_processor(config: Any) -> Any:
    """Idefics3's processor (tiles of the tower's size, images up to twice that) over a one-character tokenizer."""
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    ids = {config.image_token_id: "<image>"}
    ids.update({_tiny.IMAGE_TOKEN_ID - 1 - i: token for i, token in enumerate(_SPECIAL)})
    size = config.vision_config.image_size
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": 2 * size}, max_image_size={"longest_edge": size}, do_image_splitting=True
    )
    return Idefics3Processor(
        image_processor=image_processor, tokenizer=_tiny.tokenizer(config, ids), image_seq_len=image_tokens(config)
    )
