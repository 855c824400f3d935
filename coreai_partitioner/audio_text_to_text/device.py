"""The device form of an audio-language model's three methods: what upstream's on-device Core AI runtime runs.

``token_embedding`` and ``text_decoder`` are every multimodal task's device
form (:class:`~coreai_partitioner.text_decoder.multimodal.DeviceEmbeddedDecoder`:
int64 inputs cast to fp32 outside the delegate, the caches the program's
mutable buffers); ``audio_encoder`` is the host form's: fp32 features in,
embeddings out, static shapes.
"""

from __future__ import annotations

import torch

from coreai_partitioner.text_decoder.multimodal import DeviceEmbeddedDecoder


class DeviceAudioLanguage(DeviceEmbeddedDecoder):
    """The device form's ``audio_encoder``, ``token_embedding`` and ``text_decoder`` over a :class:`~.model.AudioLanguage`."""

    def audio_encoder(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.audio_encoder(features)
