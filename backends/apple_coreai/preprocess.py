"""``CoreAICompositeBackend``: upstream's Core AI backend, with externalized composites.

It differs from ``executorch.backends.apple.coreai.CoreAIBackend`` where that
one is broken or costly, and nowhere else:

* conversion hands each delegate's composite records to the converter;
* the boundary check runs on coreai-core 1.0.0b3's ``AIProgram`` (upstream
  calls the removed ``AIProgram.get_graph``) and understands Core AI state;
* the program ``preprocess`` gets is a copy of the graph only, not of the
  weights, and the converted IR is released before the asset is read back, so
  peak memory stays near one extra copy of the weights.

Delivery (inline named data under ``coreai/<hash>/`` with its JSON manifest,
sidecar through ``COREAI_SIDECAR_DIR``, AOT ``.aimodelc`` through
``xcrun coreai-build``) is upstream's own code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, List, final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from coreai_partitioner import _compat
from coreai_partitioner.build_records import records_for_delegate
from coreai_partitioner.programs import with_own_graph

from .convert import convert, to_aten_in_place
from .initial_state import stage_initial_state
from .io_compat import assert_io_compatible

_KEYS = _compat.COMPILE_SPEC_KEYS
_Packaging = _compat.AssetPackaging


@final
class CoreAICompositeBackend(BackendDetails):
    """Lower a Core AI delegate whose graph may call externalized composite ops.

    ExecuTorch finds a backend by class name among the direct subclasses of
    ``BackendDetails``; this name is distinct from upstream's ``CoreAIBackend``
    so the lookup never depends on import order.
    """

    @classmethod
    def copy_exported_program_for_preprocess(
        cls, edge_program: ExportedProgram, compile_specs: List[CompileSpec]
    ) -> ExportedProgram:
        """The delegate's program with its own graph and the caller's tensors.

        ``preprocess`` rewrites op targets and nothing else, so the weights need
        no copy; ExecuTorch's default deep copy would double them.
        """
        return with_own_graph(edge_program)

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

        aot = _compat.get_compile_spec(compile_specs, _KEYS.AOT_COMPILE_CONFIG) is not None
        min_os = None if aot else _compat.min_os_version(compile_specs)
        with TemporaryDirectory() as staging:
            aimodel = Path(staging) / "model.aimodel"
            created = _compat.write_program(program, aimodel, min_os)
            del program  # the IR holds a copy of the weights; release it before reading back
            model_hash = _compat.finish_asset(created)
            if not aot:
                return _compat.deliver(
                    Path(staging),
                    model_hash,
                    _Packaging.SIDECAR if sidecar_dir else _Packaging.INLINE,
                    {
                        "path": f"{model_hash}/model.aimodel",
                        "min_deployment_version": _compat.os_version_text(min_os),
                        **stage_initial_state(edge_program, Path(staging)),
                    },
                    sidecar_dir,
                )
            return _deliver_aot_compiled(aimodel, model_hash, compile_specs, sidecar_dir)


def _deliver_aot_compiled(
    aimodel: Path, model_hash: str, compile_specs: List[CompileSpec], sidecar_dir: str | None
) -> PreprocessResult:
    """Upstream's ``_preprocess_aot_compiled``, from an asset already on disk."""
    options: dict[str, Any] = _compat.aot_compile_options(compile_specs)
    compiled = aimodel.parent / "compiled"
    compiled.mkdir()
    _compat.run_coreai_build(aimodel, compiled, options)
    return _compat.deliver(
        compiled,
        model_hash,
        _Packaging.AOT_COMPILED_SIDECAR if sidecar_dir else _Packaging.AOT_COMPILED_INLINE,
        {
            "platform": options["platform"],
            "min_deployment_version": options["min_deployment_version"],
            "archs": {
                arch: f"{model_hash}/{bundle.name}"
                for arch, bundle in _compat.compiled_arch_bundles(compiled)
            },
        },
        sidecar_dir,
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
