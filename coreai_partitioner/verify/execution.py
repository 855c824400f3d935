"""Run lowered programs: Core AI delegates on the Core AI runtime, everything else in ExecuTorch or PyTorch.

Every Core AI delegate runs from the asset that actually ships: the bytes in
the ``.pte``'s named data (or the lowered module's, before serialization), or
the sidecar directory.  Nothing is converted again.  A ``.pte`` runs in
ExecuTorch's own runtime (the host Core AI backend, :mod:`coreai_partitioner.backends.apple_coreai.runtime.host`);
an in-memory program runs its operators outside the delegates in PyTorch.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coreai_partitioner import _compat
from coreai_partitioner.backends.apple_coreai.runtime.loaded_asset import LoadedAsset
from coreai_partitioner.backends.apple_coreai.runtime.pte import (
    COREAI_BACKEND_IDS, asset_files, coreai_manifest, data_file_of, materialize, read_pte,
)


class UnsupportedProgram(ValueError):
    """The program cannot be run here; the message says what is supported."""


# ---------------------------------------------------------------- assets


_compiled: dict[str, LoadedAsset] = {}


def compiled_assets() -> int:
    """How many assets this process has compiled (and keeps) for running: in-memory programs' and loaded ``.pte`` delegates'."""
    from coreai_partitioner.backends.apple_coreai.runtime import host as host_runtime

    return len(_compiled) + host_runtime.live_delegates()


def clear_cache() -> None:
    """Release every compiled asset and every carried state."""
    for asset in _compiled.values():
        asset.close()
    _compiled.clear()
    _states.clear()
    _programs.clear()


def _load(
    manifest: dict[str, Any],
    files: Callable[[], dict[str, bytes]],
    sidecar_dir: str | os.PathLike | None,
) -> LoadedAsset:
    """The compiled asset of a delegate, compiled at most once per process.

    ``files`` is asked for the asset's bytes only when it is not compiled yet.
    """
    key = manifest["hash"]
    asset = _compiled.get(key)
    if asset is None:
        with tempfile.TemporaryDirectory() as directory:
            sidecar = sidecar_dir if sidecar_dir is not None else os.environ.get("COREAI_SIDECAR_DIR")
            asset = LoadedAsset(materialize(manifest, files(), directory, sidecar_dir=sidecar))
        asset.bind(manifest["input_names"], manifest["output_names"])
        _compiled[key] = asset
    return asset


def _run_asset(asset: LoadedAsset, inputs: Sequence[torch.Tensor], state: dict | None) -> list[torch.Tensor]:
    if len(inputs) != len(asset.input_names):
        raise UnsupportedProgram(
            f"the Core AI asset takes {len(asset.input_names)} input(s) "
            f"({', '.join(asset.input_names)}), the program gives it {len(inputs)}"
        )
    arrays = {name: _to_numpy(value) for name, value in zip(asset.input_names, inputs)}
    outputs = asset(arrays, state)
    return [_to_torch(outputs[name]) for name in asset.output_names]


def _to_numpy(value: Any) -> np.ndarray:
    if not isinstance(value, torch.Tensor):
        raise UnsupportedProgram(f"a Core AI delegate takes tensors, got {type(value).__name__}")
    value = value.detach().cpu().contiguous()
    if value.dtype == torch.bfloat16:  # numpy has no bfloat16; the runtime takes ml_dtypes'
        import ml_dtypes

        return value.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return value.numpy()


def _to_torch(array: np.ndarray) -> torch.Tensor:
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(np.array(array).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(array))


# ---------------------------------------------------------------- in-memory programs


_states: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _initial_state(manifest: dict[str, Any], files: Callable[[], dict], sidecar_dir: Any) -> dict[str, np.ndarray]:
    """The values the delegate's state starts from: the ones its manifest ships, as the ``.pte`` runs them.

    Never the lowered program's buffers themselves: they are the exported
    module's, and running that module (an eager reference) writes them.
    """
    from coreai_partitioner.backends.apple_coreai.runtime.host import initial_values

    if not manifest.get("initial_state"):
        return {}
    shipped = files()

    def read(path: str) -> bytes:
        if path in shipped:
            return bytes(shipped[path])
        root = sidecar_dir if sidecar_dir is not None else os.environ.get("COREAI_SIDECAR_DIR", ".")
        return (Path(root) / manifest["hash"] / path).read_bytes()

    return initial_values(manifest, read)


class _DelegateRunner(torch.fx.Interpreter):
    """Runs a lowered graph in PyTorch, sending each delegate call to the Core AI runtime."""

    def __init__(self, module: torch.fx.GraphModule, files_for: Callable[[Any, dict], dict], sidecar_dir: Any) -> None:
        super().__init__(module)
        self._files_for = files_for
        self._sidecar_dir = sidecar_dir

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if target is not torch.ops.higher_order.executorch_call_delegate:
            return super().call_function(target, args, kwargs)
        lowered_module, *inputs = args
        manifest = _coreai_manifest(lowered_module.backend_id, lowered_module.processed_bytes)
        asset = _load(manifest, lambda: self._files_for(lowered_module, manifest), self._sidecar_dir)
        state = None
        if asset.state_names:
            state = _states.get(lowered_module)
            if state is None:
                initial = _initial_state(manifest, lambda: self._files_for(lowered_module, manifest), self._sidecar_dir)
                state = _states[lowered_module] = asset.new_state(initial)
        return tuple(_run_asset(asset, inputs, state))


def _coreai_manifest(backend_id: str, payload: bytes) -> dict[str, Any]:
    manifest = coreai_manifest(backend_id, bytes(payload))
    if manifest is None:
        raise UnsupportedProgram(
            f"the program has a {backend_id} delegate; only Core AI delegates "
            f"({', '.join(COREAI_BACKEND_IDS)}) can run here"
        )
    return manifest


def _run_in_memory(program: Any, inputs: Sequence[Any], method: str, sidecar_dir: Any) -> tuple[torch.Tensor, ...]:
    if hasattr(program, "buffer"):  # ExecutorchProgramManager: take assets from its .pte bytes

        def files_for(lowered: Any, manifest: dict) -> dict:
            shipped = read_pte(program.buffer)
            files = next((d.files for d in shipped.coreai_delegates() if d.manifest["hash"] == manifest["hash"]), {})
            # A program lowered with external_data has its asset in its data file, not in the .pte.
            return files or asset_files(lowered.named_data_store_output, manifest["hash"])
    else:

        def files_for(lowered: Any, manifest: dict) -> dict:
            return asset_files(lowered.named_data_store_output, manifest["hash"])

    try:
        exported_program = program.exported_program(method)
    except KeyError:
        raise UnsupportedProgram(f"the program has no method {method!r}") from None
    with torch.no_grad():
        outputs = _DelegateRunner(exported_program.module(), files_for, sidecar_dir).run(*inputs)
    return as_tuple(outputs)


# ---------------------------------------------------------------- .pte files


# Loaded programs by .pte digest; each holds its delegates' compiled assets and state.
_programs: dict[str, Any] = {}
# .pte digests by (path, inode, size, modification time): a file is read and hashed once, not on every call
# (a decode loop calls once per token).
_file_digests: dict[tuple, str] = {}


def _pte_digest(pte: bytes | str | os.PathLike) -> str:
    if not isinstance(pte, (str, os.PathLike)):
        return hashlib.sha256(pte).hexdigest()
    info = os.stat(pte)
    key = (os.path.realpath(pte), info.st_ino, info.st_size, info.st_mtime_ns)
    if key not in _file_digests:
        digest = hashlib.sha256()
        with open(pte, "rb") as file:
            while chunk := file.read(1 << 24):
                digest.update(chunk)
        _file_digests[key] = digest.hexdigest()
    return _file_digests[key]


def _loaded(pte: bytes | Path, sidecar_dir: Any, data_path: Any = None) -> Any:
    """The ``.pte`` (bytes, or a path read only when first loaded) loaded in ExecuTorch's runtime, once per process
    (:func:`reset_state` drops it), Core AI delegates on the host backend."""
    from coreai_partitioner.backends.apple_coreai.runtime import host as host_runtime

    key = _pte_digest(pte) + (f"+{os.path.realpath(data_path)}" if data_path is not None else "")
    program = _programs.get(key)
    if program is None:
        data = pte if isinstance(pte, bytes) else pte.read_bytes()
        try:
            program = host_runtime.load_program(data, sidecar_dir=sidecar_dir, data_path=data_path)
        except RuntimeError as error:
            raise UnsupportedProgram(f"ExecuTorch's runtime cannot load this .pte: {error}") from error
        _programs[key] = program
    return program


def _run_pte(
    pte: bytes | Path, inputs: Sequence[Any], method: str, sidecar_dir: Any, data_path: Any = None
) -> tuple[torch.Tensor, ...]:
    """Run a method of a ``.pte`` in ExecuTorch's runtime, Core AI delegates on the host backend."""
    from coreai_partitioner.backends.apple_coreai.runtime import host as host_runtime

    program = _loaded(pte, sidecar_dir, data_path)
    if method not in program.method_names:
        raise UnsupportedProgram(f"the .pte has no method {method!r}; it has {', '.join(sorted(program.method_names))}")
    host_runtime.clear_last_error()
    try:
        outputs = program.load_method(method).execute(list(inputs))
    except RuntimeError as error:
        raise RuntimeError(
            f"method {method!r} of the .pte failed in ExecuTorch's runtime: {host_runtime.last_error() or error}"
        ) from error
    return tuple(outputs)


# ---------------------------------------------------------------- public API


class PteWithData(os.PathLike):
    """A ``.pte`` path and the data file it runs with (ExecuTorch's ``data_path``): an adapter's program over its
    base's ``.ptd``.  Every function that takes a ``.pte`` path takes one."""

    def __init__(self, pte: str | os.PathLike, data: str | os.PathLike) -> None:
        self.pte, self.data = Path(pte), Path(data)

    def __fspath__(self) -> str:
        return str(self.pte)

    def __repr__(self) -> str:
        return f"PteWithData({str(self.pte)!r}, {str(self.data)!r})"


def run(
    program: Any,
    *inputs: Any,
    method: str = "forward",
    sidecar_dir: str | os.PathLike | None = None,
    data_path: str | os.PathLike | None = None,
) -> tuple[torch.Tensor, ...]:
    """Run ``program`` on ``inputs``: Core AI delegates on the Core AI runtime, the rest in PyTorch.

    ``program`` is what ``to_edge_transform_and_lower`` returns, the
    ``ExecutorchProgramManager`` after ``to_executorch()``, or a ``.pte``
    (bytes or path), which runs in ExecuTorch's own runtime with the host Core
    AI backend (:func:`coreai_partitioner.load_runtime_backend`): operators
    outside the delegates on ExecuTorch's portable kernels.
    State of stateful delegates (mutable buffers they took over) carries over
    from call to call on the same program; :func:`reset_state` starts over.
    Sidecar assets are read from ``sidecar_dir``, by default the ``.pte``'s
    directory (for a path) or ``$COREAI_SIDECAR_DIR``.  ``data_path`` is a
    ``.pte``'s data file (a program lowered with ``external_data``); for a
    path it defaults to the ``.ptd`` of the same name beside it, if there is one.
    """
    if isinstance(program, (bytes, bytearray, memoryview)):
        return _run_pte(bytes(program), inputs, method, sidecar_dir, data_path)
    if isinstance(program, (str, os.PathLike)):
        path = Path(program)
        data_path = data_path if data_path is not None else data_file_of(program)
        return _run_pte(path, inputs, method, sidecar_dir if sidecar_dir is not None else path.parent, data_path)
    if hasattr(program, "exported_program"):
        return _run_in_memory(program, inputs, method, sidecar_dir)
    raise UnsupportedProgram(
        f"cannot run a {type(program).__name__}: pass what to_edge_transform_and_lower "
        "returned, its to_executorch() result, or a .pte (bytes or path)"
    )


def method_names(pte: str | os.PathLike, data_path: str | os.PathLike | None = None) -> set[str]:
    """The methods of a ``.pte`` at a path (constant methods included), loaded as :func:`run` loads it."""
    path = Path(pte)
    data_path = data_path if data_path is not None else data_file_of(pte)
    return set(_loaded(path, path.parent, data_path).method_names)


def reset_state(program: Any = None) -> None:
    """Forget the carried state of ``program``'s delegates (of every program if None)."""
    if program is None:
        _states.clear()
        _programs.clear()
        return
    if isinstance(program, (bytes, bytearray, memoryview, str, os.PathLike)):
        # Dropping the loaded program destroys its delegates and their state; the next run reloads it.
        digest = _pte_digest(program if isinstance(program, (str, os.PathLike)) else bytes(program))
        for key in [key for key in _programs if key.split("+", 1)[0] == digest]:  # with any data file
            _programs.pop(key)
        return
    from executorch.exir.lowered_backend_module import get_lowered_backend_modules

    for method in program.methods:
        for lowered in get_lowered_backend_modules(program.exported_program(method).graph_module):
            _states.pop(lowered, None)


def as_tuple(outputs: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(outputs, torch.Tensor):
        return (outputs,)
    flat, _ = _compat.tree_flatten(outputs)
    return tuple(flat)


