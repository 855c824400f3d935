"""The Core AI backend that carries externalized composite ops into the delegate."""

from .preprocess import BACKEND_ID, CoreAICompositeBackend

__all__ = ["BACKEND_ID", "CoreAICompositeBackend"]
