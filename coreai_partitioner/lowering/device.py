"""The contract of upstream's on-device Core AI runtime, for any program lowered to it: what crosses a delegate.

Upstream's device runtime (ExecuTorch main, ``backends/apple/coreai/runtime/coreai_backend.mm``)
registers ``CoreAIBackend``, runs one asset ``function`` per delegate, passes
each input with the shape it has (``borrow_inputs``), resizes each output to
the shape Core AI returns (``copy_outputs``), takes only fp16/fp32 tensors in
the default dim order and refuses Core AI state.  A program lowered for it
(an LLM's device form, :mod:`coreai_partitioner.text_decoder.device`; a
vision-language model's or a speech model's methods) keeps its caches as
ExecuTorch's mutable buffers (:func:`executorch_config`), carries the id the
runtime registers (:func:`relabel_backend`), and is read back against these
rules before it is kept (:func:`check_delegates`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from executorch.exir import ExecutorchBackendConfig
from executorch.exir.delegate import executorch_call_delegate
from executorch.exir.lowered_backend_module import LoweredBackendModule
from executorch.exir.passes.memory_planning_pass import MemoryPlanningPass

from coreai_partitioner import _compat
from coreai_partitioner.backends.apple_coreai.io_compat import default_strides

#: The backend id upstream's on-device runtime registers (``coreai_backend.mm``).
DEVICE_BACKEND_ID = "CoreAIBackend"

#: What a device delegate's arguments may be: upstream's ``scalar_type`` takes these two.
DEVICE_DTYPES = (torch.float16, torch.float32)

def executorch_config() -> ExecutorchBackendConfig:
    """``to_executorch``'s config for the device form (a new one per call: memory planning keeps state).

    The methods share their mutable buffers (one KV cache for every method
    that reads it: ``share_mutable_buffers``), and the cache writes become
    ``index_put_`` on the buffers themselves (``run_reinplace_pass``).
    """
    return ExecutorchBackendConfig(
        run_reinplace_pass=True,
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True),
        emit_mutable_buffer_names=True,
    )


def lowered_modules(edge: Any) -> Iterator[tuple[str, LoweredBackendModule]]:
    """``(method, lowered module)`` for every delegate of an ``EdgeProgramManager``."""
    for method in edge.methods:
        graph_module = edge.exported_program(method).graph_module
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and node.target is executorch_call_delegate:
                yield method, getattr(graph_module, node.args[0].target)


def relabel_backend(edge: Any, backend_id: str = DEVICE_BACKEND_ID) -> None:
    """Give every delegate of ``edge`` the id ``backend_id``: the payload is upstream's, lowered by our backend class.

    ExecuTorch finds the class to ``preprocess`` with by id, so the delegates
    are lowered as ``CoreAICompositeBackend`` and carry the id the device
    runtime loads them under once they are.
    """
    for _, lowered in lowered_modules(edge):
        _compat.set_backend_id(lowered, backend_id)


def check_delegates(edge: Any, bounded: int | None = None) -> None:
    """Raise unless every delegate call of ``edge`` passes fp16/fp32 tensors in the default dim order, nothing else.

    A size is static, or (``bounded``, the device form's bounded layout) a symbol whose upper bound is at
    most ``bounded``: the ``.pte`` declares that bound and plans memory for it.
    """
    problems = []
    for method in edge.methods:
        for node in edge.exported_program(method).graph.nodes:
            if node.op != "call_function" or node.target is not executorch_call_delegate:
                continue
            values = [("input", arg.name, arg.meta.get("val")) for arg in node.args[1:]]
            values += [("output", f"#{i}", val) for i, val in enumerate(node.meta.get("val") or ())]
            for kind, name, val in values:
                if not isinstance(val, torch.Tensor):
                    problems.append(f"{method}: delegate {kind} {name} is {type(val).__name__}, not a tensor")
                elif val.dtype not in DEVICE_DTYPES:
                    problems.append(f"{method}: delegate {kind} {name} is {val.dtype}")
                elif not all(isinstance(size, int) or _bound(size, bounded) for size in val.shape):
                    problems.append(
                        f"{method}: delegate {kind} {name} has a symbolic shape {tuple(val.shape)} "
                        + (f"not bounded by {bounded}" if bounded else "(the static layout takes static shapes)")
                    )
                elif _strides(val) != default_strides(_upper(val.shape)):
                    problems.append(
                        f"{method}: delegate {kind} {name} {tuple(val.shape)} is not in the default dim order "
                        f"(strides {val.stride()})"
                    )
    if problems:
        raise RuntimeError(
            "the device form's delegates must pass fp16/fp32 tensors of static shape only (upstream's Core AI "
            "runtime refuses anything else):\n  " + "\n  ".join(problems)
        )


def _bound(size: Any, bounded: int | None) -> bool:
    """Whether the symbolic ``size`` has an upper bound of at most ``bounded``."""
    if bounded is None:
        return False
    upper = _compat.upper_bound(size)
    return upper is not None and upper <= bounded


def _upper(shape: torch.Size) -> tuple[int, ...]:
    return tuple(size if isinstance(size, int) else _compat.upper_bound(size) for size in shape)


def _strides(val: torch.Tensor) -> tuple[int, ...]:
    """``val``'s strides at its upper-bound shape (a symbolic stride is a product of its sizes)."""
    return tuple(stride if isinstance(stride, int) else _compat.upper_bound(stride) for stride in val.stride())
