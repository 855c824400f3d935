"""What the vision-language path refuses before any export work, each naming what and the fix."""

from __future__ import annotations


class UnsupportedVisionModel(ValueError):
    """A checkpoint this path does not export: no vision config, or a model type no family adapts."""


class UnsupportedVisionConfig(ValueError):
    """A config value a vision family cannot honour; names the model type, the field and what it takes."""

    def __init__(self, model_type: str, field: str, value: object, takes: str) -> None:
        super().__init__(f"{model_type}: config.{field} = {value!r} is not supported; it takes {takes}")
        self.field = field


class UnsupportedImage(ValueError):
    """An image the exported ``vision_encoder`` cannot take (its size is fixed at export); names the size it takes."""


class ImageTokensOverBound(ValueError):
    """More image tokens than one ``text_decoder`` call (or the context) takes; names the bound and the fix."""
