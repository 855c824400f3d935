"""Every private name this project takes from coreai-torch, coreai-core and ExecuTorch.

Keeping them in one module means the next release of any of those packages
touches this file only.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

with warnings.catch_warnings():
    # coreai-torch compares "2.13.0+cpu" > "2.13.0" and warns on the very release it validated.
    warnings.filterwarnings("ignore", message="coreai-torch has only been validated")
    import coreai_torch  # noqa: F401

from coreai_torch import TorchConverter
from coreai_torch import _patch_model_for_externalization as patch_model_for_externalization
from coreai_torch._utils import _EXTERNALIZE_NAMESPACE as EXTERNALIZE_NAMESPACE
from coreai_torch.externalize import ExternalizeSpec
from coreai_torch.externalize import _ExternalizedExportedProgram as ExternalizedProgram
from coreai_torch.externalize import _derive_composite_io_names as derive_composite_io_names
from coreai_torch.externalize import _drop_missing_call_sites as drop_missing_call_sites
from coreai_torch.externalize import _finalize_module_export as finalize_module_export
from coreai_torch.externalize import _find_marked_submodules as find_marked_submodules
from coreai_torch.externalize import _PreparedModules as PreparedModules
from coreai_torch.externalize import _restore_externalized as restore_externalized
from coreai_torch.externalize import _torch_export_module as torch_export_module
from executorch.backends.apple.coreai import get_default_compile_config, get_default_passes
from executorch.backends.apple.coreai.compiler.enumerated_shapes import (
    apply_enumerated_shapes as _apply_enumerated_shapes,
    resolve_input_enumerations,
)
from executorch.backends.apple.coreai.compiler.io_compat import (
    _edge_io as edge_io,
    io_mismatches,
)
from executorch.backends.apple.coreai.compiler.preprocess import (
    COMPILE_SPEC_KEYS,
    SIDECAR_DIR_ENV,
    AssetPackaging,
    _aot_compile_options as aot_compile_options,
    _compiled_arch_bundles as compiled_arch_bundles,
    _deliver as deliver,
    _get_compile_spec as get_compile_spec,
    _maybe_warn_sidecar_env_ignored as maybe_warn_sidecar_env_ignored,
    _min_os_version as min_os_version,
    _os_version_text as os_version_text,
    _run_coreai_build as run_coreai_build,
)
from executorch.backends.apple.coreai.partition.partitioner import (
    DO_NOT_DELEGATE_TAG,
    CoreAIPartitioner as UpstreamCoreAIPartitioner,
    _node_tensor_vals as node_tensor_vals,
    _OperatorsSupportedForCoreAIBackend as UpstreamOperatorSupport,
    do_not_delegate,
)
from executorch.backends.apple.coreai.passes.replace_copy_ops import (
    ReplaceCopyOpsWithFunctionalPass,
)
from executorch.exir._serialize._program import deserialize_pte_binary
from executorch.exir.dialects.edge._ops import EdgeOpOverload

__all__ = [
    "AssetPackaging",
    "BuildIndependentConverter",
    "COMPILE_SPEC_KEYS",
    "DO_NOT_DELEGATE_TAG",
    "EdgeOpOverload",
    "EXTERNALIZE_NAMESPACE",
    "ExternalizeSpec",
    "ExternalizedProgram",
    "PreparedModules",
    "ReplaceCopyOpsWithFunctionalPass",
    "SIDECAR_DIR_ENV",
    "TorchConverter",
    "UpstreamCoreAIPartitioner",
    "UpstreamOperatorSupport",
    "aot_compile_options",
    "apply_enumerated_shapes",
    "compiled_arch_bundles",
    "deliver",
    "finish_asset",
    "os_version_text",
    "run_coreai_build",
    "write_program",
    "deserialize_pte_binary",
    "derive_composite_io_names",
    "do_not_delegate",
    "drop_missing_call_sites",
    "edge_io",
    "finalize_module_export",
    "find_marked_submodules",
    "get_compile_spec",
    "get_default_compile_config",
    "get_default_passes",
    "io_mismatches",
    "maybe_warn_sidecar_env_ignored",
    "min_os_version",
    "node_tensor_vals",
    "patch_model_for_externalization",
    "resolve_input_enumerations",
    "restore_externalized",
    "torch_export_module",
]


class _GetGraphProgram:
    """An ``AIProgram`` with ``get_graph``: coreai-core 1.0.0b3 renamed it ``_get_graph``
    and upstream's enumerated_shapes still calls the old name."""

    def __init__(self, program: Any) -> None:
        self._program = program

    def get_graph(self, entrypoint: str) -> Any:
        return self._program._get_graph(entrypoint)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._program, name)


def apply_enumerated_shapes(program: Any, edge_program: Any, enumerations: dict) -> None:
    """Upstream's enumerated-shape attachment, on a coreai-core 1.0.0b3 ``AIProgram``."""
    _apply_enumerated_shapes(_GetGraphProgram(program), edge_program, enumerations)


_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}
_PLAIN = {torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16, torch.int32, torch.bool}
_RESOURCE_MIN_ELEMENTS = 256  # below this, or when splat, coreai-core keeps constants inline


class BuildIndependentConverter(TorchConverter):
    """``TorchConverter`` whose weight constants do not depend on the process.

    coreai-core names every weight blob after a hash seeded per process, and
    the names reach the asset's bytecode, so two builds of one model differed.
    Here a weight that coreai-core would keep as a blob (256 elements or more,
    not a splat) becomes a blob named ``weight_<n>`` in creation order, over the
    tensor's own memory where its dtype allows (no copy).  Everything else, and
    the dtypes this does not cover (sub-byte, float8), is coreai-torch's own
    ``_constant_from_tensor``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._weights = 0

    def _constant_from_tensor(self, tensor: torch.Tensor) -> Any:
        from coreai._compiler.dialects import coreai as coreai_dialect
        from coreai._compiler.ir import DenseResourceElementsAttr
        from coreai_torch._utils import get_tensor_type, validate_and_cast_numpy_array

        dtype = getattr(tensor, "future_dtype", tensor.dtype)
        if hasattr(tensor, "elem") or dtype != tensor.dtype or dtype not in _PLAIN | set(_NARROW):
            return super()._constant_from_tensor(tensor)
        array = validate_and_cast_numpy_array(_numpy_view(tensor.detach().cpu().contiguous()))
        if array.size < _RESOURCE_MIN_ELEMENTS or _is_splat(array):
            return super()._constant_from_tensor(tensor)
        attr = DenseResourceElementsAttr.get_from_buffer(
            array,
            f"weight_{self._weights}",
            get_tensor_type(tensor, self._location, dtype=dtype),
            alignment=16,
        )
        self._weights += 1
        return coreai_dialect.ConstantOp(value=attr).result


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


def write_program(program: Any, path: Any, minimum_os: Any) -> Any:
    """Serialize ``program`` into a new ``.aimodel`` at ``path``; returns the asset.

    ``AIProgram.save_asset`` serializes a clone of the IR and then reads the
    whole bytecode back to hash it while the IR is still alive, and stamps the
    wall-clock time into ``metadata.json``.  This writes the program itself (the
    caller drops it right after) and leaves the creation date out, so the
    caller can release the IR before :func:`finish_asset` reads anything back.
    """
    from coreai.authoring import OSVersion
    from coreai.authoring import asset as _asset
    from coreai.runtime import _AIModelAsset

    minimum_os = minimum_os or OSVersion.v27
    path.mkdir(parents=True)
    created = _AIModelAsset._create(path=str(path), metadata=None)
    program._module.verify()
    _asset.serialize_module_to_bytecode(
        module=program._module._mlir_module,
        package_path=created._program_bytecode_path,
        dialect_version=_AIModelAsset._dialect_version_for_os(minimum_os.value),
        bytecode_version=_asset._CURRENT_BYTECODE_VERSION,
    )
    return created


def finish_asset(created: Any) -> str:
    """Stamp the producer, hash the bytecode in chunks; returns the hash (``main.hash``) as hex.

    ``metadata.json`` is rewritten with sorted keys: coreai-core writes them in
    an order that changes from process to process.
    """
    import hashlib
    import json

    from coreai.authoring import asset as _asset

    def stamp(metadata: Any) -> None:
        metadata._producer = _asset._COREAI_PRODUCER

    created.update_metadata(updates=stamp)
    metadata_path = created.path / "metadata.json"
    metadata_path.write_text(json.dumps(json.loads(metadata_path.read_text()), indent=2, sort_keys=True) + "\n")
    digest = hashlib.sha256()
    with open(created._program_bytecode_path, "rb") as bytecode:
        for chunk in iter(lambda: bytecode.read(1 << 22), b""):
            digest.update(chunk)
    created._program_hash_path.write_bytes(digest.digest())
    return digest.hexdigest()
