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
back (:meth:`VisionLanguage.decoder_input`).
"""

from __future__ import annotations

import torch
from torch import nn

from coreai_partitioner.blocks import Step
from coreai_partitioner.text_decoder.decoder import Decoder


class TextModel(nn.Module):
    """A vision-language model's text half as :func:`coreai_partitioner.text_decoder.adapt` reads a causal LM.

    ``config`` is the text config, ``model`` the decoder stack (``embed_tokens``,
    ``layers``, ``norm``, ``rotary_emb``) and ``lm_head`` the head: the HF
    model's own modules, nothing copied.
    """

    def __init__(self, config, model: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.config = config
        self.model = model
        self.lm_head = lm_head

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype


class VisionLanguage(nn.Module):
    """``vision_encoder``, ``token_embedding`` and ``text_decoder`` over a tower, a projector and a :class:`~coreai_partitioner.text_decoder.Decoder`.

    ``tower`` maps pixels ``[1, 3, H, W]`` to patch features, ``projector``
    those to ``image_tokens`` embeddings of the decoder's width.
    ``image_size`` is ``(H, W)``; ``image_token_id`` is the placeholder the
    processor repeats ``image_tokens`` times where an image goes.
    """

    #: Whether the embeddings carry an image flag channel after the decoder's width (:meth:`decoder_input`).
    flagged = False

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
        super().__init__()
        self.model_type = model_type
        self.tower = tower
        self.projector = projector
        self.decoder = decoder
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

    @property
    def width(self) -> int:
        """The width ``D`` of what ``vision_encoder`` and ``token_embedding`` return (with the flag channel)."""
        return self.decoder.embed.weight.shape[1] + (1 if self.flagged else 0)

    def vision_encoder(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[1, 3, H, W]`` (the processor's pixel values) -> ``[1, image_tokens, D]``."""
        features = self.projector(self.tower(pixels)).to(self.decoder.dtype)
        return self.flag(features, image=True)

    def token_embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[1, n]`` int64 -> ``[1, n, D]``: the decoder's embedding, scaled where the family scales it."""
        return self.flag(self.decoder.embedding(tokens), image=False)

    def text_decoder(self, embeddings: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``[1, S, D]`` at ``positions`` ``[S]`` -> the last position's logits ``[1, 1, vocab]``; writes the caches."""
        hidden, step = self.decoder_input(embeddings, positions)
        return self.decoder.run_embedded(hidden, step)

    def flag(self, embeddings: torch.Tensor, *, image: bool) -> torch.Tensor:
        """``embeddings`` as the decoder takes them: as they are, unless the family flags images (:attr:`flagged`)."""
        if not self.flagged:
            return embeddings
        flag = torch.full_like(embeddings[..., :1], 1.0 if image else 0.0)
        return torch.cat([embeddings, flag], dim=-1)

    def decoder_input(self, embeddings: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, Step]:
        """The decoder's hidden state and the call's :class:`~coreai_partitioner.blocks.Step`."""
        hidden, image = self.split_flag(embeddings)
        return hidden, self.step(positions, image)

    def split_flag(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The decoder's hidden state, and which tokens are an image's (``[S]`` bool) where the family flags them."""
        if not self.flagged:
            return embeddings, None
        return embeddings[..., :-1], embeddings[0, :, -1] > 0.5

    def step(self, positions: torch.Tensor, image: torch.Tensor | None) -> Step:
        """The host form's step (caches the delegate's state); ``image`` says which tokens are an image's."""
        return Step(self.decoder, positions)

    def device_step(self, positions: torch.Tensor, slots: torch.Tensor, image: torch.Tensor | None) -> Step:
        """The device form's step (:class:`~coreai_partitioner.text_decoder.device.DeviceStep`: caches the program's, written
        by row at ``slots``, the int64 positions; ``positions`` are their fp32 copy)."""
        from coreai_partitioner.text_decoder.device import DeviceStep

        return DeviceStep(self.decoder, positions, slots)
