"""What the audio-language path refuses before any export work, each naming what and the fix."""

from __future__ import annotations


class UnsupportedAudioModel(ValueError):
    """A checkpoint this path does not export: no audio config, or a model type whose encoder or decoder no family lowers."""


class UnsupportedAudioConfig(ValueError):
    """A config value an audio family cannot honour; names the model type, the field and what it takes."""

    def __init__(self, model_type: str, field: str, value: object, takes: str) -> None:
        super().__init__(f"{model_type}: config.{field} = {value!r} is not supported; it takes {takes}")
        self.field = field


class UnsupportedAudio(ValueError):
    """Features the exported ``audio_encoder`` cannot take (its window is fixed at export); names the shape it takes."""


class AudioTokensOverBound(ValueError):
    """More audio embeddings than one ``text_decoder`` call (or the context) takes; names the bound and the fix."""
