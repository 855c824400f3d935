"""A processor's prompt as the runner's inputs, and the exported program run as ExecuTorch's ``MultimodalRunner`` runs it.

:func:`runner_inputs` turns a Hugging Face processor's output (``input_ids``
with each image's placeholder tokens, ``pixel_values``) into the segments an
app hands the runner: text tokens, one image per run of ``image_tokens``
placeholders (a SmolVLM tile is an image of its own), text tokens, ...
:func:`generate` runs ExecuTorch's own ``MultimodalRunner`` on a ``.pte``;
:func:`greedy` runs any of the three forms of the methods (the eager
:class:`~.model.VisionLanguage`, a lowered program, a ``.pte``) the runner's way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner.image_text_to_text.errors import UnsupportedImage
from coreai_partitioner.text_decoder import multimodal
from coreai_partitioner.text_decoder.multimodal import Methods, greedy, prefill

__all__ = ["Methods", "Segment", "check_image", "generate", "greedy", "prefill", "runner_inputs"]


@dataclass(frozen=True)
class Segment:
    """One runner input: text ``tokens``, or one image's ``pixels`` ``[3, H, W]``."""

    tokens: tuple[int, ...] = ()
    pixels: torch.Tensor | None = None

    @property
    def is_image(self) -> bool:
        return self.pixels is not None

    @property
    def encoder(self) -> str | None:
        """The method that embeds it: ``vision_encoder`` for an image, ``None`` for text (``token_embedding``)."""
        return "vision_encoder" if self.is_image else None

    def encoder_input(self) -> torch.Tensor:
        return self.pixels.unsqueeze(0)


def runner_inputs(processed: Any, image_token_id: int, image_tokens: int) -> list[Segment]:
    """The runner's inputs for a processor's output: text between images, an image per ``image_tokens`` placeholders.

    ``processed`` has ``input_ids`` ``[1, L]`` and, with images,
    ``pixel_values`` ``[images, 3, H, W]`` or ``[1, images, 3, H, W]``
    (SmolVLM's tiles); the images go to the placeholder runs in order.
    """
    ids = processed["input_ids"]
    ids = (ids[0] if ids.dim() == 2 else ids).tolist()
    pixels = processed.get("pixel_values")
    images = [] if pixels is None else list(pixels.reshape(-1, *pixels.shape[-3:]))
    pieces = multimodal.split_prompt(ids, images, image_token_id, image_tokens, what="image", source="pixel_values", error=UnsupportedImage)
    return [Segment(tokens=piece) if isinstance(piece, tuple) else Segment(pixels=piece) for piece in pieces]


def check_image(pixels: torch.Tensor, size: tuple[int, int]) -> None:
    """Raise unless ``pixels`` is ``[3, H, W]`` (or ``[1, 3, H, W]``) at the exported ``size``."""
    shape = tuple(pixels.shape[-3:]) if pixels.dim() in (3, 4) else tuple(pixels.shape)
    if pixels.dim() not in (3, 4) or (pixels.dim() == 4 and pixels.shape[0] != 1) or shape != (3, *size):
        raise UnsupportedImage(
            f"an image of shape {tuple(pixels.shape)}: the vision encoder was exported for [3, {size[0]}, {size[1]}] "
            f"(channels, height, width); resize it to {size[1]}x{size[0]} and normalize it as the processor does "
            "(preprocessor_config.json beside the .pte), or give the processor's pixel_values"
        )


def generate(
    pte: str | os.PathLike, tokenizer: str | os.PathLike, segments: Sequence[Segment], new_tokens: int
) -> list[str]:
    """ExecuTorch's own ``MultimodalRunner`` on ``pte`` (Core AI delegates on the host backend; with the ``.ptd``
    beside it, if any): its greedy output after ``segments``, one piece per generated token, the first being the
    prefill's."""

    def inputs(runner: Any) -> list:
        return [runner.make_image_input(s.pixels) if s.is_image else runner.make_token_input(list(s.tokens)) for s in segments]

    return multimodal.generate(pte, tokenizer, inputs, new_tokens)
