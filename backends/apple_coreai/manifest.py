"""The Core AI manifest, version 2, as ExecuTorch main writes it and its on-device runtime reads it.

Mirrors executorch main at e827bd84: ``compiler/preprocess.py`` (bindings),
``compiler/io_compat.py`` (``coreai_io_names``) and
``compiler/asset_manifest.py`` (files, digests); ExecuTorch 1.5.1 predates
it.  Upstream's on-device runtime refuses a manifest without these fields;
its bundle digest is the key of the device's compiled-model cache, so it
must change whenever any byte of the bundle does.  The host runtime
(:mod:`.runtime.host`) checks a ``.pte`` against the same rules.  On
ExecuTorch's next release, diff this file against those.
"""

from __future__ import annotations

import hashlib
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from coreai_partitioner import _compat

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
