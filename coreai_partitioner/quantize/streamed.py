"""The weights a scheme stores, left in the checkpoint until each is compressed (:mod:`coreai_partitioner.checkpoints`):
the float weights are never all alive, and the compressed ones stand in for them as they are made
(:func:`~.store.store_weights` reads each through :func:`~coreai_partitioner.checkpoints.materialize` or, a few rows
at a time, :func:`~coreai_partitioner.checkpoints.row_reader`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.checkpoints import load_lazily


def load_streamed(auto: Any, checkpoint: Path, config: Any, dtype: torch.dtype, scheme: Any = None) -> torch.nn.Module:
    """``auto.from_pretrained(checkpoint, dtype=dtype)``'s model, each weight ``scheme`` stores left in the checkpoint
    until it is compressed; with no ``scheme``, every parameter the checkpoint holds
    (:func:`~coreai_partitioner.checkpoints.load_lazily`)."""
    from coreai_partitioner.quantize.checks import stored_weights

    names = None if scheme is None else (lambda model: [w.name for w in stored_weights(model, scheme)])
    return load_lazily(auto, checkpoint, config, dtype, names)
