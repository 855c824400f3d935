"""Gemma 3: a SigLIP tower, an average-pool projector, Gemma 3's text decoder; one image's tokens attend each other both ways.

The tower is SigLIP's, every layer and its final LayerNorm.  The projector
average-pools the patch grid to ``mm_tokens_per_image`` tokens, norms them
with a ``(1 + w)`` RMSNorm (the ``rms_norm`` composite) and multiplies by
``mm_input_projection_weight``.  Text embeddings are scaled by
``sqrt(hidden)`` (the decoder's embedding does it), image features are not.
The head is tied to the embedding.

Hugging Face attends bidirectionally among one image's tokens when the
processor's ``token_type_ids`` mark them (``create_masks_for_vision_model``:
full layers ``causal | same image``, sliding layers ``window & (causal |
same image)``).  ExecuTorch's runner calls ``text_decoder(embeddings,
positions)`` once per segment and carries no such signal, so this family
carries it in the embeddings themselves: ``vision_encoder`` appends a
channel of ones to its ``[1, N, D]``, ``token_embedding`` a channel of
zeros, and ``text_decoder`` takes the channel off and lets the call's image
tokens attend each other (:class:`ImageBlocks`).  The runner passes
embeddings from method to method untouched and never reads their width, so
the flag reaches the decoder through the stock runner.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coreai_partitioner.blocks import Norm, Step, norm_eps
from coreai_partitioner.text_decoder.device import DeviceStep
from coreai_partitioner.image_text_to_text.families import _tiny
from coreai_partitioner.image_text_to_text.model import TextModel, VisionLanguage
from coreai_partitioner.image_text_to_text.tower import tower

MODEL_TYPES = ("gemma3",)


class ImageBlocks:
    """A step (mixed into :class:`~coreai_partitioner.blocks.Step` or a subclass) whose image tokens also
    attend the later image tokens of the same call: HF's ``blockwise_overlay`` for one image a call.

    ``image`` ``[T]`` (bool) marks the call's image tokens.  A call holds
    one segment (ExecuTorch's runner gives each image its own call), so the
    call's image tokens are one image.  Only keys after the query are added:
    earlier ones are the causal mask's already, and within a sliding window
    a later key of the same call is always inside it.
    """

    def __init__(self, *args: Any, image: torch.Tensor, **options: Any) -> None:
        super().__init__(*args, **options)
        self.image = image

    def later_images(self) -> torch.Tensor:
        """``[T, T]``: query ``t`` is an image token and key ``u > t`` one too."""

        def make():
            order = torch.arange(self.image.shape[0], dtype=torch.float32, device=self.image.device)  # no int64 op
            return self.image.unsqueeze(-1) & self.image.unsqueeze(0) & (order.unsqueeze(0) > order.unsqueeze(-1))

        return self.memoized("later_images", make)

    def ring_cache(self, size, key_cache, value_cache, k, v):
        keys, values, mask = super().ring_cache(size, key_cache, value_cache, k, v)  # the ring's keys, then the call's
        return keys, values, self.with_own(mask, key_cache.shape[2], ("ring", size))  # the ring's slots, then the call's

    def with_own(self, mask: torch.Tensor, before: int, key: tuple) -> torch.Tensor:
        """``mask`` [1, 1, T, before + T] (``before`` cache keys, then the call's own) with :meth:`later_images`
        added; made once a call per ``key``."""

        def make():
            own = self.later_images()
            earlier = torch.zeros(own.shape[0], before, dtype=torch.bool, device=own.device)
            return mask | torch.cat([earlier, own], dim=-1)[None, None]

        return self.memoized(("with_own", key), make)


class ImageStep(ImageBlocks, Step):
    """The host form's step with :class:`ImageBlocks`: a full cache's mask is over its slots, the call's at their positions."""

    def full_mask(self, length: int) -> torch.Tensor:
        def make():
            slots = torch.arange(length, dtype=self.positions.dtype, device=self.positions.device)
            written = (self.positions.unsqueeze(-1) == slots) & self.image.unsqueeze(-1)  # [T, L]
            image_slots = written.to(torch.float32).sum(0) > 0.0
            later = slots.unsqueeze(0) > self.positions.unsqueeze(-1)
            return super(ImageStep, self).full_mask(length) | (self.image.unsqueeze(-1) & image_slots & later)[None, None]

        return self.memoized(("image_full_mask", length), make)


class DeviceImageStep(ImageBlocks, DeviceStep):
    """The device form's step with :class:`ImageBlocks`: a full cache's keys are its slots, then the call's own."""

    def full_cache(self, key_cache, value_cache, k, v):
        keys, values, mask = super().full_cache(key_cache, value_cache, k, v)
        return keys, values, self.with_own(mask, key_cache.shape[2], ("full", key_cache.shape[2]))


class Gemma3VisionLanguage(VisionLanguage):
    """Gemma 3's methods: embeddings flagged image or text, one image's tokens attending each other."""

    flagged = True

    def step(self, positions: torch.Tensor, image: torch.Tensor | None) -> Step:
        return ImageStep(self.decoder, positions, image=image)

    def device_step(self, positions: torch.Tensor, slots: torch.Tensor, image: torch.Tensor | None) -> Step:
        return DeviceImageStep(self.decoder, positions, slots, image=image)


class AvgPoolProjector(nn.Module):
    """Gemma 3's ``multi_modal_projector`` over its own weights: average pool, ``(1 + w)`` RMSNorm, projection."""

    def __init__(self, projector: nn.Module) -> None:
        super().__init__()
        self.pool = projector.avg_pool
        self.side = projector.patches_per_image
        self.norm = Norm(projector.mm_soft_emb_norm.weight, norm_eps(projector.mm_soft_emb_norm), plus_one=True)
        self.weight = projector.mm_input_projection_weight

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        batch, _, width = features.shape
        grid = features.transpose(1, 2).reshape(batch, width, self.side, self.side)
        pooled = self.pool(grid).flatten(2).transpose(1, 2)
        return torch.matmul(self.norm(pooled), self.weight).to(features.dtype)


def image_tokens(config: Any) -> int:
    return config.mm_tokens_per_image


def check(config: Any, shapes: Any) -> None:
    """Nothing beyond what every family checks: Gemma 3's tower has one image size."""


def build(model: nn.Module, shapes: Any) -> VisionLanguage:
    from coreai_partitioner.text_decoder import adapt

    config = model.config
    base = model.model
    text = TextModel(config.get_text_config(), base.language_model, model.lm_head)
    size = config.vision_config.image_size
    decoder = adapt(text, shapes)
    decoder.final_softcap = None  # Gemma3ForConditionalGeneration's head soft-caps nothing, whatever the text config says
    return Gemma3VisionLanguage(
        model_type=config.model_type,
        tower=tower(base.vision_tower, config.vision_config),
        projector=AvgPoolProjector(base.multi_modal_projector),
        decoder=decoder,
        image_size=(size, size),
        image_tokens=image_tokens(config),
        image_token_id=config.image_token_id,
    ).eval()


def tiny_config(model_type: str) -> Any:
    from transformers import Gemma3Config, SiglipVisionConfig

    text = _tiny.text_config("gemma3_text", sliding_window=16)  # a window the device form's 16-token calls fit
    vision = SiglipVisionConfig(**_tiny.TOWER, vision_use_head=False, hidden_act="gelu_pytorch_tanh")
    return Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        mm_tokens_per_image=4,
        image_token_index=_tiny.IMAGE_TOKEN_ID,
        boi_token_index=_tiny.IMAGE_TOKEN_ID + 1,
        eoi_token_index=_tiny.IMAGE_TOKEN_ID + 2,
    )


def tiny_processor(config: Any) -> Any:
    """Gemma 3's processor (its image processor at the tower's size) over a one-character tokenizer."""
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    names = {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}
    ids = {config.image_token_id: names["image_token"], config.boi_token_id: names["boi_token"], config.eoi_token_id: names["eoi_token"]}
    size = config.vision_config.image_size
    return Gemma3Processor(
        image_processor=Gemma3ImageProcessorPil(size={"height": size, "width": size}),
        tokenizer=_tiny.tokenizer(config, ids, **names),
        image_seq_length=image_tokens(config),
    )
