"""The Core AI backend that carries externalized composite ops into the delegate.

Its names are imported on first use: :mod:`.preprocess` imports ExecuTorch's compiler (and so torchao, which prints),
which running a ``.pte`` (:mod:`.runtime`) does not need.  The partitioner names :data:`BACKEND_ID` before anything
lowers, so the backend class is defined by then, where ExecuTorch's ``to_backend`` finds it.
"""

from typing import Any

__all__ = ["BACKEND_ID", "CoreAICompositeBackend"]


def __getattr__(name: str) -> Any:
    """One of :mod:`.preprocess`'s names, imported on first use."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import preprocess

    return getattr(preprocess, name)
