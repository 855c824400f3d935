"""Every private name this project takes from coreai-torch, coreai-core and ExecuTorch.

Keeping them in one module means the next release of any of those packages
touches this file only.
"""

from __future__ import annotations

import warnings
from typing import Any

with warnings.catch_warnings():
    # coreai-torch compares "2.13.0+cpu" > "2.13.0" and warns on the very release it validated.
    warnings.filterwarnings("ignore", message="coreai-torch has only been validated")
    import coreai_torch  # noqa: F401

from coreai_torch import TorchConverter
from coreai_torch import _patch_model_for_externalization as patch_model_for_externalization
from coreai_torch import _subexport_and_restore as subexport_and_restore
from coreai_torch._utils import _EXTERNALIZE_NAMESPACE as EXTERNALIZE_NAMESPACE
from coreai_torch.externalize import ExternalizeSpec
from coreai_torch.externalize import _ExternalizedExportedProgram as ExternalizedProgram
from coreai_torch.externalize import _find_marked_submodules as find_marked_submodules
from coreai_torch.externalize import _restore_externalized as restore_externalized
from executorch.backends.apple.coreai import (
    CoreAIBackend as UpstreamCoreAIBackend,
    get_default_compile_config,
    get_default_passes,
)
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
    _aot_compile_options as aot_compile_options,
    _get_compile_spec as get_compile_spec,
    _maybe_warn_sidecar_env_ignored as maybe_warn_sidecar_env_ignored,
    _min_os_version as min_os_version,
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
    "COMPILE_SPEC_KEYS",
    "DO_NOT_DELEGATE_TAG",
    "EdgeOpOverload",
    "EXTERNALIZE_NAMESPACE",
    "ExternalizeSpec",
    "ExternalizedProgram",
    "ReplaceCopyOpsWithFunctionalPass",
    "SIDECAR_DIR_ENV",
    "TorchConverter",
    "UpstreamCoreAIBackend",
    "UpstreamCoreAIPartitioner",
    "UpstreamOperatorSupport",
    "aot_compile_options",
    "apply_enumerated_shapes",
    "deliver_aot_compiled",
    "deliver_portable",
    "deserialize_pte_binary",
    "do_not_delegate",
    "edge_io",
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
    "subexport_and_restore",
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


# Upstream's delivery (inline named data or sidecar, portable or AOT) works as is.
deliver_portable = UpstreamCoreAIBackend._preprocess_portable
deliver_aot_compiled = UpstreamCoreAIBackend._preprocess_aot_compiled
