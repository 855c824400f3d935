"""Shipping a delegate's Core AI asset: inline in the ``.pte``, as a sidecar, or AOT-compiled.

Mirrors ExecuTorch's ``backends/apple/coreai`` preprocess (1.5.1:
``_preprocess_aot_compiled``, and main at e827bd84: ``_deliver``), with two
changes: a large asset file streams into the ``.pte`` from disk instead of
through Python buffers (:class:`KernelCopiedData`, :func:`deliver_inline`),
and files that travel beside the bundles (initial state values) go with
them.  On ExecuTorch's next release, diff this file against those.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

from executorch.exir.backend.backend_details import PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec

from coreai_partitioner import _compat
from coreai_partitioner.backends.apple_coreai.manifest import collect_asset_metadata

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


#: The tag of the one data file every external entry goes to (``external_data=True``); the ``.ptd`` is named
#: after the ``.pte`` when written.
DATA_TAG = "model"

#: Compile spec naming the data file (``<tag>.ptd``) an inline asset's named data goes to; absent: the ``.pte``.
EXTERNAL_DATA_KEY = "coreai_partitioner.external_data"


def external_data_tag(compile_specs: list[CompileSpec]) -> str | None:
    """The data file's tag the partitioner asked for (``CoreAIPartitioner(external_data=...)``), or None."""
    for spec in compile_specs:
        if spec.key == EXTERNAL_DATA_KEY:
            return spec.value.decode("utf-8")
    return None


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
        external_tag=external_data_tag(compile_specs),
    )


def deliver(
    root: Path,
    model_hash: str,
    packaging: Any,
    manifest_extra: dict[str, Any],
    sidecar: str | None,
    beside: Path | None = None,
    external_tag: str | None = None,
) -> PreprocessResult:
    """Upstream's ``_deliver``: ship the bundles in ``root`` inline or as a sidecar, with their manifest.

    ``beside`` holds files that travel with the asset under ``<hash>/`` but
    belong to no bundle (initial state values): named data
    ``coreai/<hash>/<path>`` inline, ``<hash>/<path>`` in the sidecar,
    outside ``files`` and ``bundle_digests``.  ``external_tag`` puts the
    inline named data in the data file ``<external_tag>.ptd`` instead of the
    ``.pte`` (:func:`external_data_tag`).
    """
    manifest = {"packaging": packaging.value, "hash": model_hash, **manifest_extra}
    if sidecar is None:
        return deliver_inline(root, model_hash, manifest, beside, external_tag)
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


def take_file(path: Path) -> str:
    """``path`` moved to a new name of its own in the temporary directory (``.coreai_asset_<random>.data``).

    A new name, not a file made first and replaced: ext4 writes a file's data
    out before a rename replaces another file (``auto_da_alloc``), 0.5 s for
    the 1.2 GB asset of a 0.6B-parameter model.  ``os.link`` refuses a name
    that exists, so no file is ever replaced; the file is made private to its
    owner, as ``mkstemp`` makes one.  Where the file system has no hard links,
    a file made by ``mkstemp`` is replaced.
    """
    import secrets
    import tempfile

    while True:
        owned = os.path.join(tempfile.gettempdir(), f".coreai_asset_{secrets.token_hex(8)}.data")
        try:
            os.link(path, owned)
        except FileExistsError:
            continue
        except OSError:  # no hard links here
            descriptor, owned = tempfile.mkstemp(prefix=".coreai_asset_", suffix=".data")
            os.close(descriptor)
            os.replace(path, owned)
            return owned
        os.chmod(owned, 0o600)
        os.unlink(path)
        return owned


def deliver_inline(
    root: Path, model_hash: str, manifest: dict[str, Any], beside: Path | None = None, external_tag: str | None = None
) -> PreprocessResult:
    """The inline half of upstream's ``_deliver``, with the asset's large files left on disk.

    Upstream reads every file of the staged asset into ``bytes``, so each
    delegate's weights stay in memory once more until the ``.pte`` is written.
    Here a file over 1 MiB is moved out of ``root`` (which the caller
    deletes) into a temporary file owned by a :class:`KernelCopiedData`:
    the NamedDataStore streams it into the ``.pte`` at ``write_to_file`` and
    deletes it when the lowered program is released.  Keys, alignment and
    manifest are upstream's, so the ``.pte`` is byte for byte the same.
    With ``external_tag`` the same entries go to ``<external_tag>.ptd``:
    ExecuTorch merges that file's named data with the ``.pte``'s when the
    program is loaded with it, so a runtime finds them under the same keys.
    """
    store = _compat.NamedDataStore()

    def register(relative: str, path: Path) -> None:
        if path.stat().st_size <= IN_MEMORY_MAX_BYTES:
            data: Any = path.read_bytes()
        else:
            data = KernelCopiedData(take_file(path), cleanup=True)
        store.add_named_data(
            _compat.named_data_key(model_hash, relative), data, alignment=_compat.ASSET_ALIGNMENT, external_tag=external_tag
        )

    manifest = {**manifest, **collect_asset_metadata(root, manifest, register)}
    for path in sorted(beside.rglob("*")) if beside is not None else ():
        if path.is_file():
            register(path.relative_to(beside).as_posix(), path)
    return PreprocessResult(
        processed_bytes=json.dumps(manifest).encode("utf-8"),
        data_store_output=store.get_named_data_store_output(),
    )
