"""Export a model at another floating dtype, leaving the model as it was.

``model.half()`` would change the caller's model in place, and a round trip
back to fp32 would not restore its weights; a deep copy would hold every
weight twice.  :func:`floating_as` instead gives each floating parameter and
buffer a cast copy for the duration of a block (tied weights stay tied) and
puts the model's own tensors back afterwards, so the cost is the weights once
at the new dtype, owned by whatever the block exported.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from coreai_partitioner import _compat

FLOATING = (torch.float32, torch.float16, torch.bfloat16)


def check_dtype(dtype: Any) -> None:
    """Raise unless ``dtype`` is a floating dtype a Core AI delegate computes in."""
    if dtype not in FLOATING:
        raise ValueError(f"dtype={dtype!r} is not a floating dtype to export in; pass one of {', '.join(map(str, FLOATING))}")


def cast_sample(sample: Sequence[Any], dtype: torch.dtype) -> tuple[Any, ...]:
    """``sample`` with its floating tensors in ``dtype`` (token ids and other integers as they are)."""
    return tuple(v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in sample)


@contextmanager
def floating_as(model: torch.nn.Module, dtype: torch.dtype | None) -> Iterator[torch.nn.Module]:
    """``model`` with every floating parameter and buffer in ``dtype`` inside the block (``None``: as it is)."""
    if dtype is None:
        yield model
        return
    check_dtype(dtype)
    swapped: list[tuple[dict, str, torch.Tensor]] = []
    cast: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for module in model.modules():
            parameters, buffers, _ = _compat.module_state(module)
            for store in (parameters, buffers):
                for name, tensor in store.items():
                    if tensor is None or not tensor.is_floating_point() or tensor.dtype == dtype:
                        continue
                    if id(tensor) not in cast:
                        copy = tensor.to(dtype)
                        if isinstance(tensor, torch.nn.Parameter):
                            copy = torch.nn.Parameter(copy, requires_grad=tensor.requires_grad)
                        cast[id(tensor)] = copy
                    swapped.append((store, name, tensor))
                    store[name] = cast[id(tensor)]
    try:
        yield model
    finally:
        for store, name, tensor in swapped:
            store[name] = tensor
