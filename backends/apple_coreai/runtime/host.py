"""Run Core AI delegates inside ExecuTorch's own runtime, on this machine.

ExecuTorch 1.5.1 ships no Core AI runtime.  This module builds one: the C++
backend beside it (``CoreAIHostBackend.cpp``, installed with the package)
registered in the wheel's ``libexecutorch.so`` as ``CoreAICompositeBackend``
and ``CoreAIBackend``, which runs each delegate's asset on coreai-core's
runtime through ctypes callbacks into this module.

    from coreai_partitioner import load_runtime_backend
    from executorch.runtime import Runtime
    load_runtime_backend()
    outputs = Runtime.get().load_program("model.pte").load_method("forward").execute([x])

The boundary, one delegate at a time:

* ``init`` (C++) validates the manifest and gathers the asset's bytes (the
  program's named data, or the sidecar directory with every path kept inside
  it), then :func:`_load` checks them against the manifest's bundle digest,
  compiles the asset and creates the delegate's state: mutable buffers it
  took over, starting from the initial values the ``.pte`` ships
  (:mod:`coreai_partitioner.backends.apple_coreai.initial_state`).
  The state belongs to that loaded program, shared by the delegates of one asset's functions in it (a text
  decoder's ``forward`` and ``verify``: :data:`_states`), and carries from call to call.
* ``execute`` (C++) checks every input against the signature :func:`_signature`
  reported; :func:`_run` views the inputs without copying (the views are kept
  while ExecuTorch passes the same tensors, which a loaded method does), runs
  coreai-core on the calling thread, and hands back its output arrays, which
  the backend copies into ExecuTorch's outputs (resizing dynamic ones).
  With an ETDump (the method has an event tracer) the call is one profiling
  event, ``coreai:<function>``, and :func:`_run` runs it under coreai-core's
  profiler and logs one event per edge node its ops came from
  (:mod:`.profiling`; assets with full debug locations only).
* ``destroy`` calls :func:`_release`.

The library is compiled on first use with the system C++ compiler (``$CXX``,
``c++`` or ``g++``) against the executorch wheel's headers, and cached by the
hash of its sources and the executorch version in ``$COREAI_PARTITIONER_CACHE``
(default ``$XDG_CACHE_HOME/coreai_partitioner`` or ``~/.cache/coreai_partitioner``).
"""

from __future__ import annotations

import atexit
import contextvars
import ctypes
import hashlib
import importlib.metadata
import itertools
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..io_compat import default_strides
from ..manifest import MAIN_ENTRYPOINT, bundle_digest, bundle_files, file_chunks

from .loaded_asset import LoadedAsset

logger = logging.getLogger(__name__)

__all__ = [
    "BACKEND_IDS",
    "BuildError",
    "library_path",
    "live_delegates",
    "load_program",
    "load_runtime_backend",
    "last_error",
    "sidecars_in",
]

#: The backend ids the library registers (ours and upstream's; same payload).
BACKEND_IDS = ("CoreAICompositeBackend", "CoreAIBackend")

_SOURCES = ("CoreAIHostBackend.cpp", "Manifest.h", "coreai_host_abi.h")
_MAX_RANK = 16
_ABI_VERSION = 3


class BuildError(RuntimeError):
    """The host backend library could not be built; the message says what to install or fix."""


# ---------------------------------------------------------------- build


def _source_dir() -> Path:
    return Path(__file__).resolve().parent


def _executorch_dir() -> Path:
    import executorch.runtime

    return Path(executorch.runtime.__file__).resolve().parent.parent


def _cache_dir() -> Path:
    explicit = os.environ.get("COREAI_PARTITIONER_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "coreai_partitioner"


def _compile_command(compiler: str, source: Path, output: Path) -> list[str]:
    site = _executorch_dir()
    include = site / "include"
    lib = site / "lib"
    return [
        # ET_EVENT_TRACER_ENABLED: the event tracer hooks are inline and compile to nothing without it
        # (the wheel's libexecutorch.so is built with it).
        compiler, "-std=c++17", "-O2", "-shared", "-fPIC", "-DC10_USING_CUSTOM_GENERATED_MACROS", "-DET_EVENT_TRACER_ENABLED",
        f"-I{include}", f"-I{include / 'executorch/runtime/core/portable_type/c10'}",
        str(source), "-o", str(output),
        f"-L{lib}", "-lexecutorch", f"-Wl,-rpath,{lib}",
    ]


def library_path() -> Path:
    """The cached host backend library, built first if this source and executorch version have none."""
    sources = _source_dir()
    missing = [name for name in _SOURCES if not (sources / name).is_file()]
    if missing:
        raise BuildError(
            f"the host backend's C++ sources are missing from {sources} ({', '.join(missing)}); "
            "reinstall coreai-partitioner (pip install -e . or pip install .)"
        )
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update(name.encode() + b"\0" + (sources / name).read_bytes())
    digest.update(importlib.metadata.version("executorch").encode())
    digest.update(str(_executorch_dir()).encode())
    target = _cache_dir() / f"libcoreai_host_{digest.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    _build(sources / _SOURCES[0], target)
    return target


def _find_compiler() -> str:
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    raise BuildError(
        "no C++ compiler found to build the Core AI host backend; install one "
        "(Debian/Ubuntu: apt-get install g++, Fedora: dnf install gcc-c++, macOS: xcode-select --install) "
        "or point CXX at it"
    )


def _build(source: Path, target: Path) -> None:
    compiler = _find_compiler()
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: another process building at the same
    # time renames a complete library over ours, never a partial one.
    fd, partial = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    os.close(fd)
    command = _compile_command(compiler, source, Path(partial))
    logger.info("building the Core AI host backend: %s", " ".join(command))
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise BuildError(
                f"building the Core AI host backend failed ({compiler}, exit {result.returncode}):\n"
                f"{result.stderr.strip()}\ncommand: {' '.join(command)}"
            )
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


# ---------------------------------------------------------------- ABI


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("sizes", ctypes.c_int64 * _MAX_RANK),
        ("strides", ctypes.c_int64 * _MAX_RANK),
    ]


class _File(ctypes.Structure):
    _fields_ = [("path", ctypes.c_char_p), ("data", ctypes.c_void_p), ("nbytes", ctypes.c_int64)]


class _LoadRequest(ctypes.Structure):
    _fields_ = [
        ("method", ctypes.c_char_p),
        ("manifest_json", ctypes.c_void_p),
        ("manifest_nbytes", ctypes.c_int64),
        ("asset_dir", ctypes.c_char_p),
        ("asset_root", ctypes.c_char_p),
        ("files", ctypes.POINTER(_File)),
        ("num_files", ctypes.c_int64),
        ("program", ctypes.c_void_p),
    ]


_LoadFn = ctypes.CFUNCTYPE(
    ctypes.c_int64, ctypes.POINTER(_LoadRequest), ctypes.POINTER(ctypes.c_int32),
    ctypes.POINTER(ctypes.c_int32), ctypes.c_void_p, ctypes.c_int64,
)
_SignatureFn = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(_Tensor), ctypes.POINTER(_Tensor), ctypes.c_void_p, ctypes.c_int64
)
# The run callback takes its tensor arrays as plain addresses: cheaper to pass than
# ctypes pointers, and the delegate keys its cached views on them.
_RunFn = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int32,
    ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
)
_TENSOR_SIZE = ctypes.sizeof(_Tensor)
_ReleaseFn = ctypes.CFUNCTYPE(None, ctypes.c_int64)

# ExecuTorch ScalarType codes by numpy dtype name.
_SCALAR_TYPES = {
    "uint8": 0, "int8": 1, "int16": 2, "int32": 3, "int64": 4,
    "float16": 5, "float32": 6, "float64": 7, "bool": 11, "bfloat16": 15,
}
_DTYPES: dict[int, np.dtype] = {}


def _dtype(code: int) -> np.dtype:
    if not _DTYPES:
        import ml_dtypes

        for name, value in _SCALAR_TYPES.items():
            _DTYPES[value] = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
    return _DTYPES[code]


def _scalar_type(dtype: Any, what: str) -> int:
    name = np.dtype(dtype).name
    if name not in _SCALAR_TYPES:
        raise ValueError(f"{what} has dtype {name}, which ExecuTorch tensors cannot hold")
    return _SCALAR_TYPES[name]


# ---------------------------------------------------------------- delegates


@dataclass
class _Delegate:
    method: str
    manifest: dict[str, Any]
    asset: LoadedAsset
    state: dict[str, Any]
    input_dtypes: list[np.dtype]
    output_dtypes: list[np.dtype]
    output_codes: list[int]
    #: The input structs' bytes at the last run, and the views over ExecuTorch's memory they describe.
    #: A method's inputs sit in planned memory, so the views are built once and read afresh every run.
    input_structs: bytes = b""
    input_views: dict[str, np.ndarray] = field(default_factory=dict)
    #: The backend's output structs (their address is fixed at init), written on every run.
    output_address: int = 0
    output_structs: list[_Tensor] = field(default_factory=list)
    #: The last run's output arrays; the backend copies from them.
    outputs: list[np.ndarray] = field(default_factory=list)
    #: The rank of each output as the asset declares it.
    output_ranks: list[int] = field(default_factory=list)
    #: Which loaded program's shared state this delegate's is (:func:`_program_state`), if any.
    state_key: tuple[str, Any] | None = None

    def __post_init__(self) -> None:
        self.output_ranks = [len(self.asset.desc.output_descriptor(n).shape) for n in self.asset.output_names]

    @property
    def name(self) -> str:
        return f"Core AI delegate in method '{self.method}' (asset {self.manifest['hash'][:12]})"

    def run(self, inputs: int, num_inputs: int, outputs: int, num_outputs: int, tracer: int | None = None) -> None:
        """One call; with ExecuTorch's event tracer (ETDump on), profiled, one event per node its ops came from."""
        structs = ctypes.string_at(inputs, num_inputs * _TENSOR_SIZE) if num_inputs else b""
        if structs != self.input_structs:
            self.input_views = self._view_inputs(inputs, num_inputs)
            self.input_structs = structs
        if tracer:
            results, spans = self.asset.profiled(self.input_views, self.state)
            for node, start, end in spans:
                _library.coreai_host_log_profiling_delegate(tracer, node.encode(), start, end)
        else:
            results = self.asset(self.input_views, self.state)
        if outputs != self.output_address:
            self.output_structs = [_Tensor.from_address(outputs + i * _TENSOR_SIZE) for i in range(num_outputs)]
            self.output_address = outputs
        arrays = [np.ascontiguousarray(results[name]) for name in self.asset.output_names]
        for i, array in enumerate(arrays):
            if array.dtype != self.output_dtypes[i]:
                raise ValueError(
                    f"output '{self.asset.output_names[i]}' came back as {array.dtype}, "
                    f"the asset declares {self.output_dtypes[i]}"
                )
            if array.ndim != self.output_ranks[i]:
                raise ValueError(self._rank_changed(i, array))
            out = self.output_structs[i]
            out.data = _address(array)
            out.nbytes = array.nbytes
            out.dtype = self.output_codes[i]
            out.rank = array.ndim
            out.sizes[: array.ndim] = array.shape
        self.outputs = arrays

    def _rank_changed(self, index: int, array: np.ndarray) -> str:
        name, rank = self.asset.output_names[index], self.output_ranks[index]
        if rank == 0:
            return (
                f"output '{name}' is rank 0 in the asset, returned as {list(array.shape)}: reshape(1) it in the model "
                "or lower it again with this coreai-partitioner, which keeps a rank-0 result out of a delegate's "
                "outputs (coreai-core returns rank 0 as rank 1)"
            )
        return f"output '{name}' came back as shape {list(array.shape)}, the asset declares rank {rank}"

    def _view_inputs(self, inputs: int, num_inputs: int) -> dict[str, np.ndarray]:
        if num_inputs != len(self.asset.input_names):
            raise ValueError(f"the backend passed {num_inputs} inputs, the asset takes {len(self.asset.input_names)}")
        views = {}
        for i, name in enumerate(self.asset.input_names):
            tensor = _Tensor.from_address(inputs + i * _TENSOR_SIZE)
            shape = tuple(tensor.sizes[: tensor.rank])
            dtype = self.input_dtypes[i]
            if not tensor.nbytes:
                views[name] = np.empty(shape, dtype=dtype)
                continue
            flat = np.frombuffer((ctypes.c_char * tensor.nbytes).from_address(tensor.data), dtype=dtype)
            strides = tuple(tensor.strides[: tensor.rank])
            if strides == default_strides(shape):
                views[name] = flat.reshape(shape)
            else:  # the input follows a non-default dim order
                step = dtype.itemsize
                views[name] = np.lib.stride_tricks.as_strided(flat, shape, tuple(s * step for s in strides))
        return views


_delegates: dict[int, _Delegate] = {}
_ids = itertools.count(1)


class _OneThreadAtATime:
    """Refuses a delegate's load or run while another thread is inside one.

    ExecuTorch's Python binding swaps ``std::cout`` on entering each call and
    restores it on return, which is only safe while calls nest.  A delegate
    waits for coreai-core with the GIL released, so another thread could enter
    ExecuTorch meanwhile and return after the first, leaving ``std::cout`` on a
    freed buffer (the process then crashes at exit).  Refused at once, the
    second thread keeps the GIL until it is back out of ExecuTorch, so the
    calls still nest.
    """

    def __init__(self) -> None:
        self.owner: int | None = None
        self.depth = 0

    def __enter__(self) -> None:
        thread = threading.get_ident()
        if self.owner is not None and self.owner != thread:
            raise RuntimeError(
                "another thread is inside a Core AI delegate right now; ExecuTorch's Python binding "
                "cannot run methods from two threads at once, use one thread at a time"
            )
        self.owner = thread
        self.depth += 1

    def __exit__(self, *exc_info: Any) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.owner = None


_one_thread = _OneThreadAtATime()


def _report(error: BaseException, buffer: int, capacity: int) -> None:
    """Hand a failure to the backend, which logs it with the delegate's name."""
    message = str(error) if isinstance(error, (ValueError, RuntimeError, KeyError)) else f"{type(error).__name__}: {error}"
    encoded = message.encode("utf-8", "replace")[: max(capacity - 1, 0)]
    ctypes.memmove(buffer, encoded + b"\0", len(encoded) + 1)


def _load(request_ptr: Any, num_inputs: Any, num_outputs: Any, error: int, capacity: int) -> int:
    try:
        with _one_thread:
            return _load_delegate(request_ptr.contents, num_inputs, num_outputs)
    except BaseException as e:  # noqa: BLE001 - nothing may unwind into C++
        _report(e, error, capacity)
        return 0


def _load_delegate(request: _LoadRequest, num_inputs: Any, num_outputs: Any) -> int:
    method = request.method.decode()
    manifest = json.loads(ctypes.string_at(request.manifest_json, request.manifest_nbytes))
    if request.asset_dir:
        root = Path(request.asset_root.decode())
        _check_bundle(manifest, _sidecar_files(manifest, root))
        asset = _shared_asset(manifest, lambda: LoadedAsset(request.asset_dir.decode(), _function(manifest)))
        initial = initial_values(manifest, lambda path: (root / path).read_bytes())
    else:
        files = {
            request.files[i].path.decode(): _view(request.files[i].data, request.files[i].nbytes)
            for i in range(request.num_files)
        }
        # Every program's bytes are checked; the asset is compiled once for every program over one data file.
        _check_bundle(manifest, [(path, manifest["files"][path], [files[path]]) for path in manifest["files"]])
        asset = _shared_asset(manifest, lambda: _load_inline(manifest, files))
        initial = initial_values(manifest, lambda path: bytes(files[path]))
    try:
        asset.bind(manifest["input_names"], manifest["output_names"])
        program = (request.program, _loading.get())
        state, state_key = _program_state(manifest["hash"], program, asset, lambda: _new_state(asset, initial, manifest))
        delegate = _Delegate(method, manifest, asset, state, *_io_dtypes(asset, method, manifest))
        delegate.state_key = state_key
    except BaseException:
        _close_shared(asset)
        raise
    delegate_id = next(_ids)
    _delegates[delegate_id] = delegate
    num_inputs[0] = len(asset.input_names)
    num_outputs[0] = len(asset.output_names)
    return delegate_id


#: Loaded assets by (hash, function), with how many delegates use each.  Programs over one data file (a base and
#: its adapters) run the same asset: it is compiled once, and each delegate keeps its own state.
_assets: dict[tuple[str, str], list[Any]] = {}


def _shared_asset(manifest: dict[str, Any], load: Any) -> LoadedAsset:
    """The loaded asset of ``manifest``'s hash and function: the one already loaded, or ``load()``'s."""
    key = (manifest["hash"], _function(manifest))
    entry = _assets.get(key)
    if entry is None:
        entry = _assets[key] = [load(), 0]
    entry[1] += 1
    return entry[0]


def _close_shared(asset: LoadedAsset) -> None:
    """One delegate less on ``asset``; closed with the last."""
    for key, entry in list(_assets.items()):
        if entry[0] is asset:
            entry[1] -= 1
            if entry[1] == 0:
                del _assets[key]
                asset.close()
            return
    asset.close()


def _io_dtypes(asset: LoadedAsset, method: str, manifest: dict[str, Any]) -> tuple[list[np.dtype], list[np.dtype], list[int]]:
    """The asset's input dtypes, output dtypes and output ScalarType codes, in signature order."""
    what = f"Core AI delegate in method '{method}' (asset {manifest['hash'][:12]})"
    inputs = [_scalar_type(asset.desc.input_descriptor(n).dtype, f"{what}: input '{n}'") for n in asset.input_names]
    outputs = [_scalar_type(asset.desc.output_descriptor(n).dtype, f"{what}: output '{n}'") for n in asset.output_names]
    return [_dtype(code) for code in inputs], [_dtype(code) for code in outputs], outputs


def _view(address: int, nbytes: int) -> memoryview:
    return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B") if nbytes else memoryview(b"")


def _check_bundle(manifest: dict[str, Any], files: list[tuple[str, int, Any]]) -> None:
    """The bundle is what was exported: its digest over ``(path, size, chunks)`` per file is the manifest's.

    Stricter than upstream's device runtime, which checks file names and
    sizes only; coreai-core ends the process on a corrupt program, so a
    changed byte must be caught here.
    """
    bundle = manifest["path"].split("/", 1)[1]
    if f"{bundle}/main.mlirb" not in manifest["files"]:
        raise ValueError(f"the asset's manifest lists no {bundle}/main.mlirb; the .pte is incomplete, re-export the model")
    if bundle_digest(files) != manifest["bundle_digests"][bundle]:
        raise ValueError(
            f"the asset's files do not match the bundle digest of its manifest ({bundle}): the .pte or its "
            "sidecar is corrupt or was changed after export; re-export the model"
        )


def _sidecar_files(manifest: dict[str, Any], root: Path) -> list[tuple[str, int, Any]]:
    """The sidecar bundle's files under ``root`` (its ``<hash>/``), exactly the ones the manifest lists."""
    bundle = manifest["path"].split("/", 1)[1]
    try:
        found = bundle_files(root, bundle)
    except ValueError as error:
        raise ValueError(f"the sidecar asset in {root} cannot be read: {error}; ship the '{root.name}/' directory "
                         "the export wrote") from None
    sizes = {relative: size for relative, _, size in found}
    if sizes != manifest["files"]:
        raise ValueError(
            f"the sidecar asset in {root} holds {sorted(sizes)} ({sum(sizes.values())} bytes), its manifest lists "
            f"{sorted(manifest['files'])} ({sum(manifest['files'].values())} bytes); ship the '{root.name}/' "
            "directory the export wrote, or re-export the model"
        )
    return [(relative, size, file_chunks(path)) for relative, path, size in found]


def _function(manifest: dict[str, Any]) -> str:
    """The asset function a delegate runs: its manifest's ``function``; ``main``'s enumerated ones otherwise."""
    return manifest.get("function") or MAIN_ENTRYPOINT


def _load_inline(manifest: dict[str, Any], files: dict[str, memoryview]) -> LoadedAsset:
    with tempfile.TemporaryDirectory(prefix="coreai-host-") as directory:
        root = Path(directory) / manifest["hash"]
        for path in manifest["files"]:  # initial state values stay in memory
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(files[path])
        # The runtime compiles its own copy; the directory may go right after.
        return LoadedAsset(Path(directory) / manifest["path"], _function(manifest))


def initial_values(manifest: dict[str, Any], read: Any) -> dict[str, np.ndarray]:
    """The initial state values a manifest ships (``initial_state``), each file's bytes from ``read(path)``."""
    values = {}
    for name, entry in (manifest.get("initial_state") or {}).items():
        import ml_dtypes  # noqa: F401 - makes np.dtype("bfloat16") resolvable

        data = read(entry["file"])
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ValueError(
                f"the initial value of state '{name}' ({entry['file']}) does not match its sha256 in the manifest; "
                "the .pte or its sidecar is corrupt, re-export the model"
            )
        dtype = np.dtype(ml_dtypes.bfloat16) if entry["dtype"] == "bfloat16" else np.dtype(entry["dtype"])
        values[name] = np.frombuffer(data, dtype=dtype).reshape(entry["shape"]).copy()
    return values


def _new_state(asset: LoadedAsset, initial: dict[str, np.ndarray], manifest: dict[str, Any]) -> dict[str, Any]:
    desc = asset.desc
    unknown = sorted(set(initial) - set(asset.state_names))
    if unknown:
        raise ValueError(
            f"the manifest gives initial values for {', '.join(unknown)}, which the asset has no state for; "
            "the .pte is corrupt, export it again"
        )
    for name, value in initial.items():
        declared = desc.state_descriptor(name)
        if tuple(value.shape) != tuple(declared.shape) or value.dtype != np.dtype(declared.dtype):
            raise ValueError(
                f"the initial value of state '{name}' is {value.dtype}{list(value.shape)}, the asset declares "
                f"{np.dtype(declared.dtype)}{list(declared.shape)}; the .pte is corrupt, export it again"
            )
    return asset.new_state(initial)


def _signature(delegate_id: int, inputs: Any, outputs: Any, error: int, capacity: int) -> int:
    try:
        delegate = _delegates[delegate_id]
        desc = delegate.asset.desc
        for i, name in enumerate(delegate.asset.input_names):
            _describe(desc.input_descriptor(name), inputs[i], f"{delegate.name}: input '{name}'")
        for i, name in enumerate(delegate.asset.output_names):
            _describe(desc.output_descriptor(name), outputs[i], f"{delegate.name}: output '{name}'")
        return 0
    except BaseException as e:  # noqa: BLE001
        _report(e, error, capacity)
        return 1


def _describe(descriptor: Any, out: _Tensor, what: str) -> None:
    shape = list(descriptor.shape)
    if len(shape) > _MAX_RANK:
        raise ValueError(f"{what} has rank {len(shape)}; ExecuTorch tensors have at most {_MAX_RANK} dimensions")
    out.dtype = _scalar_type(descriptor.dtype, what)
    out.rank = len(shape)
    for d, size in enumerate(shape):
        out.sizes[d] = size if isinstance(size, int) and size >= 0 else -1


def _run(
    delegate_id: int, inputs: int, num_inputs: int, outputs: int, num_outputs: int, tracer: int | None,
    error: int, capacity: int,
) -> int:
    try:
        with _one_thread:
            _delegates[delegate_id].run(inputs, num_inputs, outputs, num_outputs, tracer)
        return 0
    except BaseException as e:  # noqa: BLE001
        _report(e, error, capacity)
        return 1


def _address(array: np.ndarray) -> int:
    try:  # a fraction of array.ctypes.data's cost, for the writable arrays coreai-core hands back
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError):  # read-only or empty
        return array.ctypes.data


#: The Core AI state of each asset in each loaded program ((hash, program) -> [state, delegates]): the delegates
#: of one asset's functions in one program share it, as a Core AI program's functions share its state (a text
#: decoder's forward and verify read and write one KV cache).  Two loads, or a base and its adapters, never do.
_states: dict[tuple[str, Any], list[Any]] = {}

#: Which call of :func:`load_program` is loading methods, if any.  The runtime tells a program by where its named
#: data keys are, and two loads of one ``bytes`` object read their keys from the same place: this tells them apart
#: (loads from files map their own copies; ExecuTorch's ``Runtime.load_program`` of one buffer twice is the case
#: only :func:`load_program` mends).
_loading: contextvars.ContextVar[int | None] = contextvars.ContextVar("coreai_host_loading", default=None)
_loads = itertools.count()


def _program_state(
    asset_hash: str, program: tuple[int | None, int | None], asset: LoadedAsset, new: Any
) -> tuple[dict[str, Any], tuple[str, Any] | None]:
    """The state of ``asset``'s function in the loaded ``program`` (the runtime's identity of it and the
    :func:`load_program` call loading it; its names, each the array every function of the asset there reads: a
    function may declare fewer than another, ``forward`` than ``verify``), and its key."""
    if not program[0] or not asset.state_names:
        return new(), None
    key = (asset_hash, program)
    entry = _states.setdefault(key, [{}, 0])
    shared = entry[0]
    missing = [name for name in asset.state_names if name not in shared]
    if missing:
        made = new()
        shared.update({name: made[name] for name in missing})
    entry[1] += 1
    return {name: shared[name] for name in asset.state_names}, key


def _release_state(key: tuple[str, Any] | None) -> None:
    """One delegate less on the shared state of ``key``; forgotten with the last."""
    entry = _states.get(key) if key is not None else None
    if entry is not None:
        entry[1] -= 1
        if entry[1] == 0:
            del _states[key]


def _release(delegate_id: int) -> None:
    delegate = _delegates.pop(delegate_id, None)
    if delegate is not None:
        _release_state(delegate.state_key)
        try:
            _close_shared(delegate.asset)
        except Exception:  # noqa: BLE001 - destroy cannot fail
            logger.exception("closing %s", delegate.name)


# ---------------------------------------------------------------- loading


_library: ctypes.CDLL | None = None
_callbacks: tuple[Any, ...] = ()
_lock = threading.RLock()


def load_runtime_backend() -> list[str]:
    """Build (once, cached) and load the host Core AI backend into ExecuTorch's runtime.

    Idempotent.  Returns the backend ids it registered
    (``CoreAICompositeBackend`` and ``CoreAIBackend``); afterwards
    ``executorch.runtime.Runtime.get().load_program(...)`` runs ``.pte`` files
    with Core AI delegates.
    """
    global _library, _callbacks
    with _lock:
        if _library is not None:
            return list(BACKEND_IDS)
        from executorch.runtime import Runtime

        registry = Runtime.get().backend_registry  # loads libexecutorch.so first
        path = library_path()
        library = ctypes.CDLL(str(path), mode=os.RTLD_GLOBAL)
        library.coreai_host_set_callbacks.restype = ctypes.c_int32
        library.coreai_host_set_callbacks.argtypes = [_LoadFn, _SignatureFn, _RunFn, _ReleaseFn]
        library.coreai_host_set_sidecar_dir.argtypes = [ctypes.c_char_p]
        library.coreai_host_set_sidecar_dir.restype = None
        library.coreai_host_live_delegates.restype = ctypes.c_int64
        library.coreai_host_log_profiling_delegate.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64]
        library.coreai_host_log_profiling_delegate.restype = None
        library.coreai_host_last_error.restype = ctypes.c_char_p
        callbacks = (_LoadFn(_load), _SignatureFn(_signature), _RunFn(_run), _ReleaseFn(_release))
        version = library.coreai_host_set_callbacks(*callbacks)
        if version != _ABI_VERSION:
            raise BuildError(f"the host backend library speaks ABI {version}, this module {_ABI_VERSION}; clear {_cache_dir()}")
        missing = [name for name in BACKEND_IDS if not registry.is_available(name)]
        if missing:
            raise BuildError(
                f"the host backend library loaded but {', '.join(missing)} is not registered in ExecuTorch's "
                "runtime; another library registered that id first"
            )
        _library, _callbacks = library, callbacks
        atexit.register(_unregister)
        logger.info("Core AI host backend loaded from %s", path)
        return list(BACKEND_IDS)


def _unregister() -> None:
    # Programs freed during interpreter shutdown must not call back into Python.
    if _library is not None:
        _library.coreai_host_set_callbacks(_LoadFn(), _SignatureFn(), _RunFn(), _ReleaseFn())
    for delegate_id in list(_delegates):
        _release(delegate_id)


def last_error() -> str:
    """The last error a Core AI delegate logged on this thread while loading or running ("" if none)."""
    return "" if _library is None else _library.coreai_host_last_error().decode("utf-8", "replace")


def clear_last_error() -> None:
    if _library is not None:
        _library.coreai_host_clear_last_error()


_RUNTIME_ERRORS = {
    0x14: "an operator outside the Core AI delegates has no kernel in this ExecuTorch build "
    "(the portable kernels lack it); keep it inside a delegate or register a kernel library that has it",
    0x23: "the program is invalid (truncated or corrupt .pte); export it again",
}


def _explain(error: RuntimeError) -> str:
    import re

    match = re.search(r"error: 0x:?([0-9a-fA-F]+)", str(error))
    hint = _RUNTIME_ERRORS.get(int(match.group(1), 16)) if match else None
    return f"{error} ({hint})" if hint else str(error)


def live_delegates() -> int:
    """How many Core AI delegates ExecuTorch has loaded and not yet destroyed."""
    return 0 if _library is None else int(_library.coreai_host_live_delegates())


@contextmanager
def sidecars_in(directory: str | os.PathLike | None) -> Iterator[None]:
    """Read sidecar assets from ``directory`` for methods loaded inside the block.

    Outside any block, sidecar assets are read from ``$COREAI_SIDECAR_DIR``.
    """
    load_runtime_backend()
    with _lock:
        setter = _library.coreai_host_set_sidecar_dir
        setter(None if directory is None else os.fsencode(os.path.abspath(directory)))
        try:
            yield
        finally:
            setter(None)


def load_program(
    pte: bytes | bytearray | str | os.PathLike,
    *,
    sidecar_dir: str | os.PathLike | None = None,
    data_path: str | os.PathLike | None = None,
) -> Any:
    """An ``executorch.runtime.Program`` with every method loaded.

    Sidecar assets are read from ``sidecar_dir``, by default the ``.pte``'s
    own directory (or ``$COREAI_SIDECAR_DIR`` for bytes).  ``data_path`` is
    the program's data file (``.ptd``, ExecuTorch's ``data_path``): the
    weights of a program lowered with ``external_data``; for a path it
    defaults to the ``.ptd`` beside it (:func:`~.pte.data_file_of`).
    """
    from executorch.runtime import Runtime

    from .pte import data_file_of

    load_runtime_backend()
    if data_path is None:
        data_path = data_file_of(pte)
    if isinstance(pte, (str, os.PathLike)) and sidecar_dir is None:
        sidecar_dir = Path(pte).resolve().parent
    if sidecar_dir is None:
        sidecar_dir = os.environ.get("COREAI_SIDECAR_DIR")
    data = bytes(pte) if isinstance(pte, (bytes, bytearray, memoryview)) else str(pte)
    if data_path is not None:
        program = Runtime.get().load_program(data, data_path=str(data_path))
    else:
        program = Runtime.get().load_program(data)
    token = _loading.set(next(_loads))
    try:
        with sidecars_in(sidecar_dir):
            for method in sorted(program.method_names):
                clear_last_error()
                try:
                    program.load_method(method)
                except RuntimeError as error:
                    raise RuntimeError(f"loading method '{method}': {last_error() or _explain(error)}") from error
    finally:
        _loading.reset(token)
    return program
