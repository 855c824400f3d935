"""The three methods ExecuTorch's ``MultimodalRunner`` calls, over one vision-language model: :class:`VisionLanguage`.

The runner (``extension/llm/runner/multimodal_prefiller.cpp``) feeds a prompt
segment by segment, each segment one ``text_decoder`` call:

* a text segment: ``token_embedding(tokens [1, n] int64) -> [1, n, D]``;
* an image: ``vision_encoder(pixels [1, 3, H, W]) -> [1, N, D]`` (the runner
  adds the batch dimension when input 0 has rank 4, and neither resizes nor
  normalizes: the caller gives the processor's pixel values);
* then ``text_decoder(embeddings [1, S, D], positions [S] int64) -> logits
  [1, 1, vocab]`` (the last position's), positions ``arange(start, start + S)``;
* a decode step: ``token_embedding([[token]])`` then ``text_decoder`` at one position.

The runner converts no dtype between them and never reads ``D``: whatever
``vision_encoder`` and ``token_embedding`` return, ``text_decoder`` takes.
A family that must tell an image's embeddings from text's (Gemma 3 attends
both ways among one image's tokens) appends a channel to both and reads it
back (:meth:`VisionLanguage.decoder_input`).  ``token_embedding`` and
``text_decoder`` are every multimodal task's
(:class:`~coreai_partitioner.text_decoder.multimodal.EmbeddedDecoder`); this
room adds ``vision_encoder``.
"""

from __future__ import annotations

import torch
from torch import nn

from coreai_partitioner.text_decoder.decoder import Decoder
from coreai_partitioner.text_decoder.multimodal import EmbeddedDecoder, TextModel

__all__ = ["TextModel", "VisionLanguage"]


class VisionLanguage(EmbeddedDecoder):
    """``vision_encoder``, ``token_embedding`` and ``text_decoder`` over a tower, a projector and a :class:`~coreai_partitioner.text_decoder.Decoder`.

    ``tower`` maps pixels ``[1, 3, H, W]`` to patch features, ``projector``
    those to ``image_tokens`` embeddings of the decoder's width.
    ``image_size`` is ``(H, W)``; ``image_token_id`` is the placeholder the
    processor repeats ``image_tokens`` times where an image goes.
    """

    def __init__(
        self,
        *,
        model_type: str,
        tower: nn.Module,
        projector: nn.Module,
        decoder: Decoder,
        image_size: tuple[int, int],
        image_tokens: int,
        image_token_id: int,
    ) -> None:
        super().__init__(model_type=model_type, decoder=decoder)
        self.tower = tower
        self.projector = projector
        self.image_size = tuple(image_size)
        self.image_tokens = image_tokens
        self.image_token_id = image_token_id

    @classmethod
    def of_config(cls, config, *, tower: nn.Module, projector: nn.Module, decoder: Decoder, image_tokens: int):
        """The model of a Hugging Face vision-language ``config`` (its ``model_type``, square images of its vision
        config's ``image_size``, its ``image_token_id``) over these parts, in eval mode."""
        side = config.vision_config.image_size
        return cls(
            model_type=config.model_type, tower=tower, projector=projector, decoder=decoder, image_size=(side, side),
            image_tokens=image_tokens, image_token_id=config.image_token_id,
        ).eval()

    def vision_encoder(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[1, 3, H, W]`` (the processor's pixel values) -> ``[1, image_tokens, D]``."""
        features = self.projector(self.tower(pixels)).to(self.decoder.dtype)
        return self.flag(features, encoded=True)
