"""Run Core AI assets on this machine's Core AI runtime (Linux CPU included).

coreai-core's runtime is asynchronous: calling a function returns an asyncio
future on the running loop, which a runtime worker thread completes with
``call_soon_threadsafe``.  This module gives it a synchronous face.  A call
runs on the calling thread's own event loop, so the only thread handoff is the
worker waking the caller; a thread whose loop is already running (a notebook,
an async test) hands its calls to one background loop thread instead, which
costs two more wakeups per call.  Loading and closing an asset, rare and slow,
always run on the background loop.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coreai_partitioner import _compat

logger = logging.getLogger(__name__)

_background: asyncio.AbstractEventLoop | None = None
_background_lock = threading.Lock()


def _on_background_loop(coroutine: Any) -> Any:
    global _background
    with _background_lock:
        if _background is None:
            _background = asyncio.new_event_loop()
            threading.Thread(target=_background.run_forever, name="coreai-runtime", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coroutine, _background).result()


class _OwnLoop:
    """A thread's own event loop for runtime calls, closed when the thread ends and drops it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def __del__(self) -> None:
        if not self.loop.is_running():
            self.loop.close()


_threads = threading.local()


def _run(coroutine: Any) -> Any:
    """Run one coroutine of coreai-core's runtime to completion from synchronous code."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        own = getattr(_threads, "own", None)
        if own is None:
            own = _threads.own = _OwnLoop()
        return own.loop.run_until_complete(coroutine)
    return _on_background_loop(coroutine)


@dataclass(frozen=True)
class _Shape:
    """A descriptor whose dims that differ between an asset's functions are -1."""

    shape: tuple[int, ...]
    dtype: Any


class _EnumeratedDescriptor:
    """The descriptor of an asset compiled for several input shapes, as one function.

    Names, dtypes and state are the functions' own (they share them); a dim is
    -1 where the functions disagree (the enumerated one, and what follows from it).
    """

    def __init__(self, descs: list[Any]) -> None:
        self._descs = descs
        first = descs[0]
        self.input_names, self.output_names, self.state_names = first.input_names, first.output_names, first.state_names

    def _merged(self, kind: str, name: str) -> _Shape:
        found = [getattr(desc, kind)(name) for desc in self._descs]
        shapes = [tuple(d.shape) for d in found]
        if len({len(shape) for shape in shapes}) != 1:
            return _Shape(tuple(-1 for _ in shapes[0]), found[0].dtype)
        return _Shape(tuple(dims[0] if len(set(dims)) == 1 else -1 for dims in zip(*shapes)), found[0].dtype)

    def input_descriptor(self, name: str) -> _Shape:
        return self._merged("input_descriptor", name)

    def output_descriptor(self, name: str) -> _Shape:
        return self._merged("output_descriptor", name)

    def state_descriptor(self, name: str) -> Any:
        return self._descs[0].state_descriptor(name)


class LoadedAsset:
    """A Core AI asset loaded for execution: compiled once, callable many times.

    An asset whose ``function`` was compiled for enumerated input shapes (the
    functions ``<function>_<key>`` that ``input_enumerations`` makes, sharing
    weights and state) is one callable too: each call runs the function whose
    input shapes match.  The asset directory may be deleted once this object
    exists; the runtime works from its own compiled copy until :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike, function: str = "main") -> None:
        from coreai.authoring import AIModelAsset

        self.path = Path(path)
        asset = AIModelAsset.load(self.path)
        names = list(asset.summary().function_names)
        chosen = [function] if function in names else [n for n in names if n.startswith(function + "_")]
        if not chosen:
            raise ValueError(f"the Core AI asset at {self.path} has no function {function!r}; it has {', '.join(names)}")
        self._context = asset.executable()
        self._model = _on_background_loop(self._context.__aenter__())
        self._functions = {name: self._model.load_function(name) for name in chosen}
        descs = [function.desc for function in self._functions.values()]
        #: The function's descriptor (names, shapes and dtypes of its inputs, outputs and state).
        self.desc = desc = descs[0] if len(descs) == 1 else _EnumeratedDescriptor(descs)
        self.input_names: list[str] = list(desc.input_names)
        self.output_names: list[str] = list(desc.output_names)
        self.state_names: list[str] = list(desc.state_names)
        self._by_shapes = {
            self._shapes({n: function.desc.input_descriptor(n).shape for n in self.input_names}): name
            for name, function in self._functions.items()
        }
        self._profiled: dict[str, Any] = {}
        self._recorder: Any = None
        self._sources: dict[int, str] | None = None
        _open_assets.add(self)
        logger.info("compiled Core AI asset %s (%s)", self.path, ", ".join(chosen))

    def bind(self, input_names: Sequence[str], output_names: Sequence[str]) -> None:
        """Take inputs and give outputs in a manifest's order: its graph-order names, state left out.

        ExecuTorch passes a delegate its arguments by position, in that order.
        """
        inputs = [name for name in input_names if name not in self.state_names]
        outputs = [name for name in output_names if name not in self.state_names]
        if sorted(inputs) != sorted(self.input_names) or sorted(outputs) != sorted(self.output_names):
            raise ValueError(
                f"the manifest binds inputs {inputs} and outputs {outputs}, but the asset's function takes "
                f"{self.input_names} and returns {self.output_names}; the .pte is corrupt, re-export the model"
            )
        self.input_names, self.output_names = inputs, outputs

    @staticmethod
    def _shapes(by_name: Mapping[str, Sequence[Any]]) -> tuple:
        return tuple((name, tuple(by_name[name])) for name in sorted(by_name))

    def _function_for(self, inputs: Mapping[str, Any]) -> str:
        if len(self._functions) == 1:
            return next(iter(self._functions))
        shapes = self._shapes({name: np.shape(inputs[name]) for name in self.input_names})
        function = self._by_shapes.get(shapes)
        if function is None:
            raise ValueError(
                f"the Core AI asset at {self.path} is compiled for input shapes "
                f"{' or '.join(str(dict(key)) for key in self._by_shapes)}; "
                f"this call gives {dict(shapes)}. Pad the input to one of them"
            )
        return function

    def new_state(self, initial: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
        """State arrays for this asset, which the runtime updates in place on every call.

        A state without an initial value starts at zero, shaped as the asset declares it.
        """
        from coreai.runtime import NDArray

        initial = initial or {}
        state = {}
        for name in self.state_names:
            if name in initial:
                value = np.ascontiguousarray(initial[name])
            else:
                desc = self.desc.state_descriptor(name)
                value = np.zeros(tuple(desc.shape), dtype=np.dtype(desc.dtype))
            state[name] = NDArray(value)
        return state

    def __call__(
        self,
        inputs: Mapping[str, np.ndarray],
        state: Mapping[str, Any] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run the function once; ``state`` (from :meth:`new_state`) carries over between calls."""
        return self._call(self._functions, inputs, state)

    def profiled(
        self, inputs: Mapping[str, np.ndarray], state: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], list[tuple[str, int, int]]]:
        """:meth:`__call__` under coreai-core's profiler: the outputs and the call's per-node spans.

        A span is ``(delegate-graph node, first op's start, last op's end)`` in
        ``CLOCK_MONOTONIC_RAW`` nanoseconds (:mod:`.profiling`); there are none
        unless the asset keeps full debug locations.  The profiled functions
        are loaded on the first call.
        """
        from coreai.runtime import Profiler

        from . import profiling

        if self._recorder is None:
            self._recorder = profiling.Recorder()
            recorder = self._recorder
            profiler = Profiler(on_log_event_begin=recorder.begin, on_log_event_end=recorder.end)
            self._profiled = {name: self._model.load_function(name, profiler=profiler) for name in self._functions}
            self._sources = profiling.op_sources(_compat.runtime_debug_infos(self._model))
        self._recorder.take()
        outputs = self._call(self._profiled, inputs, state)
        return outputs, profiling.node_spans(self._recorder.take(), self._sources)

    def _call(
        self, functions: Mapping[str, Any], inputs: Mapping[str, np.ndarray], state: Mapping[str, Any] | None
    ) -> dict[str, np.ndarray]:
        from coreai.runtime import NDArray

        if self.state_names and state is None:
            raise ValueError(
                f"the asset at {self.path} is stateful ({', '.join(self.state_names)}); "
                "pass state=asset.new_state(...)"
            )
        function = functions[self._function_for(inputs)]
        arrays = {name: NDArray(np.ascontiguousarray(value)) for name, value in inputs.items()}
        outputs = _run(function(arrays, state=dict(state or {})))
        return {name: value.numpy() for name, value in outputs.items()}

    def close(self) -> None:
        if self in _open_assets:
            _open_assets.discard(self)
            _on_background_loop(self._context.__aexit__(None, None, None))


_open_assets: set[LoadedAsset] = set()


@atexit.register
def _close_all() -> None:
    for asset in list(_open_assets):
        try:
            asset.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
