"""The three methods ExecuTorch's ``MultimodalRunner`` calls over one audio-language model: :class:`AudioLanguage`.

The runner (``extension/llm/runner/multimodal_prefiller.cpp``) hands an audio
input to ``audio_encoder`` as fp32 features ``[batch, bins, frames]`` (what
``make_audio_input`` was given: the feature extractor's ``input_features``,
one row per window), reads the encoder's ``[1, N, D]`` and feeds it to
``text_decoder`` in one call, as it feeds an image's; text segments go
through ``token_embedding``.  ``token_embedding`` and ``text_decoder`` are
every multimodal task's
(:class:`~coreai_partitioner.text_decoder.multimodal.EmbeddedDecoder`); this
room adds ``audio_encoder``.

``audio_encoder`` takes one window ``[1, bins, frames]``: a recording longer
than a window is the feature extractor's windows, one runner audio input
each, in order (:func:`.run.runner_inputs`), so their embeddings land in the
cache one after the other, which is the concatenation the model's own
``get_audio_features`` makes of a batch of windows.
"""

from __future__ import annotations

import torch
from torch import nn

from coreai_partitioner.text_decoder.decoder import Decoder
from coreai_partitioner.text_decoder.multimodal import EmbeddedDecoder


class AudioLanguage(EmbeddedDecoder):
    """``audio_encoder``, ``token_embedding`` and ``text_decoder`` over an audio tower, a projector and a
    :class:`~coreai_partitioner.text_decoder.Decoder`.

    ``tower`` maps one window's features ``[1, bins, frames]`` to hidden states,
    ``projector`` those to ``audio_tokens`` embeddings of the decoder's width.
    ``audio_token_id`` is the placeholder the processor repeats
    ``audio_tokens`` times a window where the audio goes.
    """

    def __init__(
        self,
        *,
        model_type: str,
        tower: nn.Module,
        projector: nn.Module,
        decoder: Decoder,
        bins: int,
        frames: int,
        audio_tokens: int,
        audio_token_id: int,
    ) -> None:
        super().__init__(model_type=model_type, decoder=decoder)
        self.tower = tower
        self.projector = projector
        self.bins = bins
        self.frames = frames
        self.audio_tokens = audio_tokens
        self.audio_token_id = audio_token_id

    def audio_encoder(self, features: torch.Tensor) -> torch.Tensor:
        """``[1, bins, frames]`` fp32 (one window of the feature extractor's ``input_features``) -> ``[1, audio_tokens, D]``."""
        embeddings = self.projector(self.tower(features)).to(self.decoder.dtype)
        return self.flag(embeddings, encoded=True)

