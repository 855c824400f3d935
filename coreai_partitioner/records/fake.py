"""Memoized fake implementations for externalized ops.

coreai-torch registers a submodule's own ``forward`` as its op's fake impl, so
every time ExecuTorch re-traces or verifies the graph on fake tensors
(``to_edge``, each pass, the IR verifier) each call site runs its whole
submodule (an attention, say) again: with a symbolic sequence length, tens of
milliseconds of symbolic shape arithmetic per call site and trace, a fifth of
an LLM export.  The output's metadata depends only on the inputs' metadata,
so it is computed once per distinct input signature:

- concrete inputs: the signature is their shapes, strides and dtypes;
- symbolic inputs: their sizes and strides as expressions with the symbols
  renamed in order of appearance, each with its value range, so two call
  sites over the same ``T`` (in this trace or the next one's shape
  environment) share an entry.  The output is reused only when every
  symbolic output size is one of the inputs' sizes and the output is
  contiguous; it is then rebuilt from the current inputs' sizes.

Anything else (an output size that is a new expression, a non-tensor input
that is not a plain scalar) runs the forward every time.

Call sites that would export to the same graph (:func:`~.subexport.module_key`:
the same classes, attributes and weight shapes; every layer's RMSNorm) share
their entries, so a decoder's forward runs once per composite, not once per
layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch

from coreai_partitioner import _compat
from coreai_partitioner.records.subexport import module_key

_SCALARS = (type(None), bool, int, float, str)


def _inputs(args: tuple, kwargs: dict) -> list[tuple[Any, Any]] | None:
    """``(name, value)`` of every input in a fixed order, or None if one is neither a tensor nor a plain scalar."""
    named = [*enumerate(args), *sorted(kwargs.items())]
    if not all(isinstance(value, (torch.Tensor, *_SCALARS)) for _, value in named):
        return None
    return named


class _Renamer:
    """Symbolic sizes as expressions over canonically renamed symbols (with their ranges)."""

    def __init__(self) -> None:
        self.symbols: dict[sympy.Symbol, sympy.Symbol] = {}
        self.ranges: list[tuple[str, str]] = []

    def __call__(self, size: int | torch.SymInt) -> Any:
        if not isinstance(size, torch.SymInt):
            return size
        expr = _compat.sym_expr(size)
        for symbol in sorted(expr.free_symbols, key=str):
            if symbol not in self.symbols:
                self.symbols[symbol] = sympy.Symbol(f"_{len(self.symbols)}", integer=True)
                self.ranges.append(_compat.symbol_range(size, symbol))
        return ("sym", str(expr.xreplace(self.symbols)))


def _signature(named: list[tuple[Any, Any]]) -> tuple:
    """The inputs' metadata: sizes, strides, dtypes and scalar values, symbols renamed canonically."""
    rename = _Renamer()
    key: list[Any] = []
    for name, value in named:
        key.append(name)
        if isinstance(value, torch.Tensor):
            key.append((tuple(map(rename, value.shape)), tuple(map(rename, value.stride())), value.dtype,
                        value.device.type))
        else:
            key.append((type(value), value))
    key.append(tuple(rename.ranges))
    return tuple(key)


def _input_sizes(named: list[tuple[Any, Any]]) -> dict[Any, tuple[int, int]]:
    """Each symbolic input size's expression -> (input index, dim) of its first occurrence."""
    found: dict[Any, tuple[int, int]] = {}
    for index, (_, value) in enumerate(named):
        if isinstance(value, torch.Tensor):
            for dim, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt):
                    found.setdefault(_compat.sym_expr(size), (index, dim))
    return found


def _contiguous(tensor: torch.Tensor) -> bool:
    expected = 1
    for size, stride in reversed(list(zip(tensor.shape, tensor.stride()))):
        if _compat.sym_expr(size) != 1 and sympy.expand(_compat.sym_expr(stride) - _compat.sym_expr(expected)) != 0:
            return False
        expected = expected * size
    return True


def _describe(output: Any, sizes: dict[Any, tuple[int, int]]) -> Any:
    """How to rebuild ``output`` from the inputs, or None when it cannot be rebuilt from their sizes."""
    if isinstance(output, torch.Tensor):
        symbolic = any(isinstance(d, torch.SymInt) for d in (*output.shape, *output.stride()))
        if not symbolic:
            return (tuple(output.shape), output.stride(), output.dtype, output.device)
        shape = []
        for size in output.shape:
            if isinstance(size, torch.SymInt):
                source = sizes.get(_compat.sym_expr(size))
                if source is None:
                    return None
                shape.append(source)
            else:
                shape.append(size)
        return (("from inputs", tuple(shape)), None, output.dtype, output.device) if _contiguous(output) else None
    if isinstance(output, (tuple, list)):
        described = [_describe(o, sizes) for o in output]
        return None if any(d is None for d in described) else (type(output), described)
    return None


def _rebuild(description: Any, named: list[tuple[Any, Any]]) -> Any:
    if isinstance(description[0], type):
        kind, items = description
        return kind(_rebuild(item, named) for item in items)
    shape, stride, dtype, device = description
    if stride is None:  # symbolic and contiguous: sizes taken from this call's inputs
        sizes = [named[s[0]][1].shape[s[1]] if isinstance(s, tuple) else s for s in shape[1]]
        return torch.empty(sizes, dtype=dtype, device=device)
    return torch.empty_strided(shape, stride, dtype=dtype, device=device)


def memoized(forward: Callable[..., Any], outputs: dict[tuple, Any] | None = None) -> Callable[..., Any]:
    """A fake impl that runs ``forward`` once per input signature; ``outputs`` holds what it learned
    (a dict shared with the fake impls of modules that trace alike)."""
    outputs = {} if outputs is None else outputs

    def fake(*args: Any, **kwargs: Any) -> Any:
        named = _inputs(args, kwargs)
        key = None if named is None else _signature(named)
        if key is not None and key in outputs:
            return _rebuild(outputs[key], named)
        result = forward(*args, **kwargs)
        if key is not None:
            description = _describe(result, _input_sizes(named))
            if description is not None:
                outputs[key] = description
        return result

    return fake


def memoize_fake_impls(modules: list[torch.nn.Module], namespace: str) -> None:
    """Re-register the fake impl of every patched module's op as :func:`memoized`, shared by modules that trace alike."""
    shared: dict[tuple, dict[tuple, Any]] = {}
    for module in modules:
        op_name, forward = _compat.externalized_op_of(module)
        key = module_key(module)
        outputs = {} if key is None else shared.setdefault(key, {})
        torch.library.register_fake(f"{namespace}::{op_name}", memoized(forward, outputs))
