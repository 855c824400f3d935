"""Code mirrored from upstream with small changes, in one place.

Each piece names what it mirrors and why it differs.  Mirrors
executorch 1.5.1 (``backends/apple/coreai``), the Core AI manifest of
executorch main at e827bd84 (version 2, which upstream's on-device runtime
reads; 1.5.1 predates it), coreai-torch 0.4.3 (``converter.py``,
``externalize.py``) and coreai-core 1.0.0b3 (``authoring/asset.py``): on the
next release of any of them, diff this file against theirs.  Private names
come from :mod:`coreai_partitioner._compat`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from executorch.exir.backend.backend_details import PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from . import _compat

# ----------------------------------------------------------- executorch 1.5.1

#: Upstream ``CoreAIPartitioner.partition``'s message for the legacy flow, with our records.
LEGACY_FLOW_ERROR = (
    "CoreAIPartitioner must be used with to_edge_transform_and_lower(). "
    "The to_edge() + to_backend() workflow is not supported because it "
    "decomposes ops that Core AI lowers directly. Please use:\n"
    "    exir.to_edge_transform_and_lower(\n"
    '        {"forward": exported_program},\n'
    "        partitioner=[CoreAIPartitioner(externalized_modules=records)],\n"
    "        compile_config=get_default_compile_config(),\n"
    "    )"
)


def to_aten(program: ExportedProgram) -> ExportedProgram:
    """Upstream's ``_prepare_program_for_conversion``, in place on a program the caller owns.

    Upstream deep-copies the program (weights included) first; the backend
    hands this a copy of the graph only.  Node names are kept.
    """
    _compat.ReplaceCopyOpsWithFunctionalPass()(program.graph_module)
    for node in program.graph.nodes:
        if node.op == "call_function":
            node.target = _compat.aten_op(node.target)
    program.graph_module.recompile()
    return program


def sidecar_dir(compile_specs: list[CompileSpec]) -> str | None:
    """Upstream ``preprocess``'s build-time sidecar directory, or None for inline delivery."""
    if _compat.get_compile_spec(compile_specs, _compat.COMPILE_SPEC_KEYS.USES_SIDECAR) is None:
        return None
    directory = os.environ.get(_compat.SIDECAR_DIR_ENV)
    if not directory:
        raise ValueError(
            "sidecar asset delivery requires the "
            f"{_compat.SIDECAR_DIR_ENV} environment variable to name the "
            "build-time output directory (set it via coreai_sidecar_dir)"
        )
    return directory


def deliver_aot_compiled(
    aimodel: Path, model_hash: str, compile_specs: list[CompileSpec], sidecar: str | None, bindings: dict[str, Any]
) -> PreprocessResult:
    """Upstream's ``_preprocess_aot_compiled``, from an asset already on disk.

    ``xcrun coreai-build`` exists only on macOS; upstream's own error says so
    when it is missing.  The bundles land beside ``aimodel``'s directory.
    """
    options: dict[str, Any] = _compat.aot_compile_options(compile_specs)
    compiled = aimodel.parent.parent / "compiled"
    compiled.mkdir()
    _compat.run_coreai_build(aimodel, compiled, options)
    packaging = _compat.AssetPackaging
    return deliver(
        compiled,
        model_hash,
        packaging.AOT_COMPILED_SIDECAR if sidecar else packaging.AOT_COMPILED_INLINE,
        {
            **bindings,
            "platform": options["platform"],
            "min_deployment_version": options["min_deployment_version"],
            "archs": {
                arch: f"{model_hash}/{bundle.name}"
                for arch, bundle in _compat.compiled_arch_bundles(compiled)
            },
        },
        sidecar,
    )


# ------------------------------------------------- executorch main @e827bd84: manifest version 2
#
# ``compiler/preprocess.py`` (bindings, ``_deliver``), ``compiler/io_compat.py``
# (``coreai_io_names``) and ``compiler/asset_manifest.py`` (files, digests).
# Upstream's on-device runtime refuses a manifest without them; its bundle
# digest is the key of the device's compiled-model cache, so it must change
# whenever any byte of the bundle does.

MANIFEST_VERSION = 2
MAIN_ENTRYPOINT = "main"
_DIGEST_DOMAIN = b"ExecuTorch.CoreAI.raw-assets.sha256.v1\0"
_CHUNK_BYTES = 1 << 20


def coreai_io_names(program: Any, entrypoint: str = MAIN_ENTRYPOINT) -> tuple[list[str], list[str]]:
    """An entrypoint's argument and result names (``coreai.name``), in graph order.

    State arguments and their token results are included, as upstream writes them.
    """
    graph = _compat.coreai_graph(program, entrypoint)
    function_type = graph.function_type.value
    names = []
    for kind, attrs, types in (
        ("input", graph.arg_attrs, function_type.inputs),
        ("output", graph.res_attrs, function_type.results),
    ):
        ordered = [a["coreai.name"].value for a in attrs if "coreai.name" in a]
        if len(ordered) != len(types) or not all(ordered) or len(set(ordered)) != len(ordered):
            raise ValueError(f"Core AI {kind} names must be complete and unique")
        names.append(ordered)
    return names[0], names[1]


def bindings(
    input_names: list[str],
    output_names: list[str],
    *,
    stateful: bool,
    specializations: dict[str, dict[str, tuple]] | None = None,
    function: str = MAIN_ENTRYPOINT,
) -> dict[str, Any]:
    """The manifest's runtime bindings: names, the function (or enumerated functions), what the device refuses."""
    fields: dict[str, Any] = {"version": MANIFEST_VERSION, "input_names": input_names, "output_names": output_names}
    if specializations:
        fields["functions"] = [
            {"name": f"{MAIN_ENTRYPOINT}_{key}", "input_shapes": {name: list(shape) for name, shape in shapes.items()}}
            for key, shapes in specializations.items()
        ]
        fields["runtime_supported"] = False
        fields["runtime_unsupported_reason"] = "enumerated_shapes"
    else:
        fields["function"] = function
    if stateful:
        fields["runtime_supported"] = False
        fields["runtime_unsupported_reason"] = "stateful"
    return fields


def _check_component(name: Any) -> None:
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        raise ValueError(f"unsafe Core AI asset path component: {name!r}")
    name.encode("utf-8")


def _utf8(name: str) -> bytes:
    return name.encode("utf-8")


def declared_bundles(manifest: dict[str, Any]) -> list[str]:
    """The bundle directories a manifest declares (``model.aimodel``, ``model.<arch>.aimodelc``), in UTF-8 order."""
    model_hash = manifest["hash"]
    _check_component(model_hash)
    packaging = manifest["packaging"]
    if packaging in ("inline", "sidecar"):
        bundles = {"model.aimodel": manifest["path"]}
    elif packaging in ("aot_compiled_inline", "aot_compiled_sidecar"):
        archs = manifest["archs"]
        if not isinstance(archs, dict) or not archs:
            raise ValueError("Core AI assets require declared architectures")
        for arch in archs:
            _check_component(arch)
        bundles = {f"model.{arch}.aimodelc": path for arch, path in archs.items()}
    else:
        raise ValueError(f"unknown Core AI asset packaging: {packaging!r}")
    for bundle, path in bundles.items():
        if path != f"{model_hash}/{bundle}":
            raise ValueError(f"invalid declared Core AI bundle path: {path!r}")
    return sorted(bundles, key=_utf8)


def bundle_digest(files: Iterable[tuple[str, int, Iterable[bytes]]]) -> str:
    """The digest of one bundle: ``(path under the asset root, size, its bytes in chunks)`` per file.

    Domain-separated SHA-256 over the file count, then per file in UTF-8
    order of its path: the path's length and bytes, the size, the contents
    (all lengths 8-byte big-endian).  Lowercase hex.
    """
    ordered = sorted(files, key=lambda file: _utf8(file[0]))
    digest = hashlib.sha256(_DIGEST_DOMAIN)
    digest.update(len(ordered).to_bytes(8, "big"))
    for relative, size, chunks in ordered:
        name = _utf8(relative)
        digest.update(len(name).to_bytes(8, "big") + name + size.to_bytes(8, "big"))
        read = 0
        for chunk in chunks:
            digest.update(chunk)
            read += len(chunk)
        if read != size:
            raise ValueError(f"Core AI asset file {relative} has {read} bytes, {size} were declared")
    return digest.hexdigest()


def file_chunks(path: Path) -> Iterator[bytes]:
    """A file's bytes in 1 MiB chunks, read as they are hashed."""
    with open(path, "rb") as source:
        while chunk := source.read(_CHUNK_BYTES):
            yield chunk


def bundle_files(root: Path, bundle: str) -> list[tuple[str, Path, int]]:
    """``(path under root, file, size)`` of every file in the bundle ``root/bundle``, in UTF-8 order.

    The bundle must be a real directory of regular files and directories,
    each name a safe path component, and hold at least one file.
    """
    top = root / bundle
    if not stat.S_ISDIR(top.lstat().st_mode):
        raise ValueError(f"Core AI bundle must be a non-symlink directory: {top}")
    files: list[tuple[str, Path, int]] = []
    pending = [top]
    while pending:
        path = pending.pop()
        _check_component(path.name)
        info = path.lstat()
        if stat.S_ISDIR(info.st_mode):
            pending.extend(path.iterdir())
        elif stat.S_ISREG(info.st_mode):
            files.append((path.relative_to(root).as_posix(), path, info.st_size))
        else:
            raise ValueError(f"Core AI assets reject symlinks and special files: {path}")
    if not files:
        raise ValueError(f"Core AI bundle contains no files: {top}")
    return sorted(files, key=lambda file: _utf8(file[0]))


def collect_asset_metadata(
    root: Path, manifest: dict[str, Any], register: Callable[[str, Path], None] | None = None
) -> dict[str, Any]:
    """Upstream's ``collect_asset_metadata``: ``version``, ``files`` (sizes) and ``bundle_digests`` of ``root``.

    ``root`` must hold exactly the bundles ``manifest`` declares, real
    directories of regular files.  ``register(path under root, file)`` is
    called once per file after it is hashed (inline delivery stores it).
    """
    bundles = declared_bundles(manifest)
    if not stat.S_ISDIR(root.lstat().st_mode):
        raise ValueError(f"Core AI asset root must be a non-symlink directory: {root}")
    if {path.name for path in root.iterdir()} != set(bundles):
        raise ValueError("Core AI asset root must contain exactly the declared bundles")
    sizes: dict[str, int] = {}
    digests: dict[str, str] = {}
    for bundle in bundles:
        files = bundle_files(root, bundle)
        digests[bundle] = bundle_digest((relative, size, file_chunks(path)) for relative, path, size in files)
        for relative, path, size in files:
            sizes[relative] = size
            if register is not None:
                register(relative, path)
    return {"version": MANIFEST_VERSION, "files": sizes, "bundle_digests": digests}


def deliver(
    root: Path,
    model_hash: str,
    packaging: Any,
    manifest_extra: dict[str, Any],
    sidecar: str | None,
    beside: Path | None = None,
) -> PreprocessResult:
    """Upstream's ``_deliver``: ship the bundles in ``root`` inline or as a sidecar, with their manifest.

    ``beside`` holds files that travel with the asset under ``<hash>/`` but
    belong to no bundle (initial state values): named data
    ``coreai/<hash>/<path>`` inline, ``<hash>/<path>`` in the sidecar,
    outside ``files`` and ``bundle_digests``.
    """
    manifest = {"packaging": packaging.value, "hash": model_hash, **manifest_extra}
    if sidecar is None:
        return deliver_inline(root, model_hash, manifest, beside)
    return deliver_sidecar(root, model_hash, manifest, sidecar, beside)


def deliver_sidecar(
    root: Path, model_hash: str, manifest: dict[str, Any], sidecar: str, beside: Path | None = None
) -> PreprocessResult:
    """The sidecar half of upstream's ``_deliver``: staged in ``.<hash>.partial``, renamed to ``<hash>/``."""
    destination = Path(sidecar) / model_hash
    destination.parent.mkdir(parents=True, exist_ok=True)
    _compat.reject_existing_asset_dir(destination)
    pending = destination.with_name(f".{model_hash}.partial")
    if pending.exists():
        shutil.rmtree(pending)
    try:
        pending.mkdir(parents=True)
        for bundle in sorted(root.iterdir()):
            shutil.move(str(bundle), str(pending / bundle.name))
        manifest.update(collect_asset_metadata(pending, manifest))
        for entry in sorted(beside.iterdir()) if beside is not None and beside.is_dir() else ():
            shutil.move(str(entry), str(pending / entry.name))
        pending.rename(destination)
    except BaseException:
        shutil.rmtree(pending, ignore_errors=True)
        raise
    return PreprocessResult(processed_bytes=json.dumps(manifest).encode("utf-8"))


# ----------------------------------------------------------- coreai-torch 0.4.3


def subexport_and_restore(
    model: torch.nn.Module,
    exported_program: ExportedProgram,
    export_call_site: Callable[[Any], ExportedProgram],
) -> list[Any]:
    """coreai-torch's ``_subexport_and_restore`` (Phases 2-3), exporting through ``export_call_site``.

    coreai-torch exports every call site's submodule itself; here the caller
    decides (:class:`coreai_partitioner.subexport.SharedExports` exports
    identical call sites once).  Returns one record per call site.  The
    model's patched forwards are restored whatever happens.
    """
    try:
        _compat.drop_missing_call_sites(model, exported_program)
        return [
            _compat.finalize_module_export(prep, export_call_site(prep))
            for prep in _compat.PreparedModules(model, exported_program)
        ]
    finally:
        _compat.restore_externalized(_compat.find_marked_submodules(model))


_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}
_PLAIN = {torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16, torch.int32, torch.bool}
_RESOURCE_MIN_ELEMENTS = 256  # below this, or when splat, coreai-core keeps constants inline


class BuildIndependentConverter(_compat.TorchConverterBase):
    """``TorchConverter`` whose weight constants do not depend on the process.

    Mirrors coreai-torch's ``_constant_from_tensor`` (as :meth:`constant`, which
    ``_compat.TorchConverterBase`` calls from it).  coreai-core names every
    weight blob after a hash seeded per process, and the names reach the
    asset's bytecode, so two builds of one model differed.  Here a weight that
    coreai-core would keep as a blob (256 elements or more, not a splat)
    becomes a blob named ``weight_<n>`` in creation order, over the tensor's
    own memory where its dtype allows (no copy); a sub-byte weight (int4) is
    its bit-packed bytes, as coreai-torch embeds them.  Everything else (float8,
    small or splat constants) is coreai-torch's own.  ``stack_traces=False`` is
    coreai-torch's ``Mode.RELEASE`` (operation IDs only).
    """

    def __init__(self, *, stack_traces: bool = True) -> None:
        mode = _compat.TorchConverter.Mode.DEBUG if stack_traces else _compat.TorchConverter.Mode.RELEASE
        super().__init__(mode=mode)
        self._weights = 0

    def constant(self, tensor: torch.Tensor, location: Any) -> Any:
        dtype = getattr(tensor, "future_dtype", tensor.dtype)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        api = _compat.coreai_constant_api()
        if hasattr(tensor, "elem"):  # sub-byte (int4): coreai-torch embeds the bit-packed bytes of .elem as they are
            array = api.validate_and_cast_numpy_array(tensor.elem.detach().cpu().contiguous().numpy())
        elif dtype != tensor.dtype or dtype not in _PLAIN | set(_NARROW):
            return None
        else:
            array = api.validate_and_cast_numpy_array(_numpy_view(tensor.detach().cpu().contiguous()))
        if array.size < _RESOURCE_MIN_ELEMENTS or _is_splat(array):
            return None
        attr = api.DenseResourceElementsAttr.get_from_buffer(
            array,
            f"weight_{self._weights}",
            api.get_tensor_type(tensor, location, dtype=dtype),
            alignment=16,
        )
        self._weights += 1
        return api.ConstantOp(value=attr).result


def _numpy_view(tensor: torch.Tensor) -> Any:
    """The bytes coreai-torch would embed for ``tensor``, without a copy where possible."""
    if tensor.dtype in _NARROW:
        return tensor.to(_NARROW[tensor.dtype]).numpy()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy()
    return tensor.numpy()


def _is_splat(array: Any) -> bool:
    import numpy as np

    bits = array.reshape(-1).view(np.dtype(f"u{array.itemsize}"))
    first = bits[0]
    return bool(bits[-1] == first and bits[len(bits) // 2] == first and (bits == first).all())


def strip_debug_info(program: Any, *, keep_op_ids: bool) -> None:
    """coreai-torch's ``debugging.debug_info.strip_debug_info``, with operation IDs optional.

    Every op's location becomes coreai-torch's unknown debug location: with a
    sequential operation ID when ``keep_op_ids`` (what coreai-torch's own
    function does), with no metadata otherwise.  In place.
    """
    module_op = _compat.mlir_module(program)[1].operation
    context = module_op.context
    source = _compat.CoreAILocation.file(filename="", line=0, col=0, context=context)
    _compat.set_op_location(module_op, _compat.unknown_location(None, source, context))
    for index, operation in enumerate(_compat.nested_operations(module_op)):
        operation_id = _compat.OperationID(type="coreai", value=index) if keep_op_ids else None
        location = _compat.unknown_location(operation_id, source, context)
        _compat.set_op_location(operation, location)
        for region in operation.regions:
            for block in region:
                for argument in block.arguments:
                    _compat.set_block_arg_location(argument, location)


# ----------------------------------------------------------- coreai-core 1.0.0b3


def write_program(program: Any, path: Path, minimum_os: Any) -> Any:
    """``AIProgram.save_asset`` without its clone of the IR and its creation date.

    ``save_asset`` serializes a clone of the IR, then reads the whole bytecode
    back to hash it while the IR is still alive, and stamps the wall-clock
    time into ``metadata.json``.  This writes the program itself (the caller
    drops it right after), so the IR can be released before
    :func:`finish_asset` reads anything back.  Returns the created asset.
    """
    from coreai.authoring import OSVersion

    api = _compat.coreai_asset_api()
    minimum_os = minimum_os or OSVersion.v27
    path.mkdir(parents=True)
    created = api.create(path=str(path), metadata=None)
    module, mlir_module = _compat.mlir_module(program)
    module.verify()
    bytecode_path, _ = _compat.asset_paths(created)
    api.serialize_module_to_bytecode(
        module=mlir_module,
        package_path=bytecode_path,
        dialect_version=api.dialect_version_for_os(minimum_os.value),
        bytecode_version=api.bytecode_version,
    )
    return created


def finish_asset(created: Any) -> str:
    """Stamp the producer, hash the bytecode in chunks; returns the hash (``main.hash``) as hex.

    ``metadata.json`` is rewritten with sorted keys: coreai-core writes them in
    an order that changes from process to process.
    """
    producer = _compat.coreai_asset_api().producer
    created.update_metadata(updates=lambda metadata: _compat.set_producer(metadata, producer))
    metadata_path = created.path / "metadata.json"
    metadata_path.write_text(json.dumps(json.loads(metadata_path.read_text()), indent=2, sort_keys=True) + "\n")
    bytecode_path, hash_path = _compat.asset_paths(created)
    digest = hashlib.sha256()
    with open(bytecode_path, "rb") as bytecode:
        for chunk in iter(lambda: bytecode.read(1 << 22), b""):
            digest.update(chunk)
    hash_path.write_bytes(digest.digest())
    return digest.hexdigest()


#: Asset files up to this size are read into the NamedDataStore; larger ones stay on disk.
IN_MEMORY_MAX_BYTES = 1 << 20


class KernelCopiedData(_compat.FileBackedData):
    """ExecuTorch's ``FileBackedData``, written into the ``.pte`` by the kernel (``os.sendfile``).

    Upstream copies the file through Python buffers (``shutil.copyfileobj``):
    3.5 s for the 1.2 GB asset of a 0.6B-parameter model on this machine.
    An output without a file descriptor gets upstream's copy.
    """

    def write_to_file(self, outfile: Any) -> None:
        try:
            descriptor = outfile.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):
            super().write_to_file(outfile)
            return
        outfile.flush()
        start = outfile.tell()
        path = _compat.backing_file(self)
        with open(path, "rb") as source:
            sent = 0
            while sent < len(self):  # sendfile writes at, and advances, the output's own offset
                count = os.sendfile(descriptor, source.fileno(), sent, len(self) - sent)
                if count == 0:
                    raise OSError(f"{path} ended after {sent} of {len(self)} bytes")
                sent += count
        outfile.seek(start + sent)  # the buffered writer learns where the descriptor now is


def deliver_inline(
    root: Path, model_hash: str, manifest: dict[str, Any], beside: Path | None = None
) -> PreprocessResult:
    """The inline half of upstream's ``_deliver``, with the asset's large files left on disk.

    Upstream reads every file of the staged asset into ``bytes``, so each
    delegate's weights stay in memory once more until the ``.pte`` is written.
    Here a file over 1 MiB is moved out of ``root`` (which the caller
    deletes) into a temporary file owned by a :class:`KernelCopiedData`:
    the NamedDataStore streams it into the ``.pte`` at ``write_to_file`` and
    deletes it when the lowered program is released.  Keys, alignment and
    manifest are upstream's, so the ``.pte`` is byte for byte the same.
    """
    import tempfile

    store = _compat.NamedDataStore()

    def register(relative: str, path: Path) -> None:
        if path.stat().st_size <= IN_MEMORY_MAX_BYTES:
            data: Any = path.read_bytes()
        else:
            descriptor, owned = tempfile.mkstemp(prefix=".coreai_asset_", suffix=".data")
            os.close(descriptor)
            os.replace(path, owned)
            data = KernelCopiedData(owned, cleanup=True)
        store.add_named_data(_compat.named_data_key(model_hash, relative), data, alignment=_compat.ASSET_ALIGNMENT)

    manifest = {**manifest, **collect_asset_metadata(root, manifest, register)}
    for path in sorted(beside.rglob("*")) if beside is not None else ():
        if path.is_file():
            register(path.relative_to(beside).as_posix(), path)
    return PreprocessResult(
        processed_bytes=json.dumps(manifest).encode("utf-8"),
        data_store_output=store.get_named_data_store_output(),
    )
