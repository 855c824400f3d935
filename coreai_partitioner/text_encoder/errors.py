"""What the text encoder path refuses, each error naming the model type, module or field and the way out."""

from __future__ import annotations


class UnsupportedTextEncoder(ValueError):
    """A ``model_type`` no family here adapts, or a config value a family cannot honour."""


class UnsupportedSentenceModel(ValueError):
    """A sentence-transformers checkpoint whose modules (``modules.json``) or pooling mode this path does not compute."""
