"""``CoreAICompositeBackend``: upstream's Core AI backend, with externalized composites.

It differs from ``executorch.backends.apple.coreai.CoreAIBackend`` in two
places only: conversion hands each delegate's composite records to the
converter, and the boundary checks run on coreai-core 1.0.0b3's ``AIProgram``
(upstream calls the removed ``AIProgram.get_graph``) and understand Core AI
state (see ``io_compat``).  Delivery (inline named
data under ``coreai/<hash>/``, sidecar through ``COREAI_SIDECAR_DIR``, AOT
``.aimodelc`` through ``xcrun coreai-build``) is upstream's own code.
"""

from __future__ import annotations

import json
import os
from typing import List, final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from coreai_partitioner import _compat
from coreai_partitioner.build_records import records_for_delegate

from .convert import convert, to_aten_in_place
from .io_compat import assert_io_compatible

_KEYS = _compat.COMPILE_SPEC_KEYS


@final
class CoreAICompositeBackend(BackendDetails):
    """Lower a Core AI delegate whose graph may call externalized composite ops.

    ExecuTorch finds a backend by class name among the direct subclasses of
    ``BackendDetails``; this name is distinct from upstream's ``CoreAIBackend``
    so the lookup never depends on import order.
    """

    @staticmethod
    def preprocess(
        edge_program: ExportedProgram,
        compile_specs: List[CompileSpec],
    ) -> PreprocessResult:
        sidecar_dir = _sidecar_dir(compile_specs)
        records = records_for_delegate(edge_program.graph)
        program = convert(to_aten_in_place(edge_program), records)

        assert_io_compatible(program, edge_program)
        raw_enumerations = _compat.get_compile_spec(compile_specs, _KEYS.INPUT_ENUMERATIONS)
        if raw_enumerations:
            _compat.apply_enumerated_shapes(
                program, edge_program, json.loads(raw_enumerations.decode())
            )

        if sidecar_dir is None:
            _compat.maybe_warn_sidecar_env_ignored()
        if _compat.get_compile_spec(compile_specs, _KEYS.AOT_COMPILE_CONFIG) is not None:
            return _compat.deliver_aot_compiled(
                program, _compat.aot_compile_options(compile_specs), sidecar_dir
            )
        return _compat.deliver_portable(
            program, _compat.min_os_version(compile_specs), sidecar_dir
        )


def _sidecar_dir(compile_specs: List[CompileSpec]) -> str | None:
    """The build-time sidecar directory, or None for inline delivery."""
    if _compat.get_compile_spec(compile_specs, _KEYS.USES_SIDECAR) is None:
        return None
    sidecar_dir = os.environ.get(_compat.SIDECAR_DIR_ENV)
    if not sidecar_dir:
        raise ValueError(
            "sidecar asset delivery requires the "
            f"{_compat.SIDECAR_DIR_ENV} environment variable to name the "
            "build-time output directory (set it via coreai_sidecar_dir)"
        )
    return sidecar_dir


BACKEND_ID = CoreAICompositeBackend.__name__
