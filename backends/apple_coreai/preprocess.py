"""``CoreAICompositeBackend``: upstream's Core AI backend, with externalized composites.

It differs from ``executorch.backends.apple.coreai.CoreAIBackend`` where that
one is broken or costly, and nowhere else:

* conversion hands each delegate's composite records to the converter;
* the boundary check runs on coreai-core 1.0.0b3's ``AIProgram`` (upstream
  calls the removed ``AIProgram.get_graph``) and understands Core AI state;
* it converts its own copy of the delegate's graph, never of the weights
  (ExecuTorch's default deep copy is skipped and the caller's program is left
  as it was), and the converted IR is released before the asset is read back,
  so peak memory stays near one extra copy of the weights;
* each call site's record comes from the call site itself, where the
  partitioner put it (:mod:`coreai_partitioner.build_records`);
* it returns a ``debug_handle_map`` (:mod:`.debug_handles`), so ExecuTorch's
  Inspector maps the delegate's profiling events to the edge graph.

Delivery (inline named data under ``coreai/<hash>/`` with its JSON manifest,
sidecar through ``COREAI_SIDECAR_DIR``, AOT ``.aimodelc`` through
``xcrun coreai-build``) and the manifest (version 2: ordered I/O names, each
file's size, a digest per bundle, which upstream's on-device runtime
requires) mirror upstream in :mod:`coreai_partitioner._upstream`.
"""

from __future__ import annotations

import json
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import List, final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from coreai_partitioner import _compat, _upstream
from coreai_partitioner.programs import with_own_graph

from . import debug_info
from .debug_handles import debug_handle_map
from .convert import convert
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
        """The program itself: ``preprocess`` never changes the program it is given.

        It works on its own copy of the graph, sharing the weights; ExecuTorch's
        default deep copy here would double them.
        """
        return edge_program

    @staticmethod
    def preprocess(
        edge_program: ExportedProgram,
        compile_specs: List[CompileSpec],
    ) -> PreprocessResult:
        sidecar_dir = _upstream.sidecar_dir(compile_specs)
        converted = with_own_graph(edge_program)
        program = convert(converted, debug_info.requested(compile_specs))

        assert_io_compatible(program, converted)  # its state writes in Core AI's state order
        input_names, output_names = _upstream.coreai_io_names(program)  # before enumerated shapes replace main
        raw_enumerations = _compat.get_compile_spec(compile_specs, _KEYS.INPUT_ENUMERATIONS)
        specializations = (
            _compat.apply_enumerated_shapes(program, edge_program, json.loads(raw_enumerations.decode()))
            if raw_enumerations
            else None
        )
        signature = edge_program.graph_signature
        bindings = _upstream.bindings(
            input_names,
            output_names,
            stateful=bool(signature.buffers_to_mutate or signature.user_inputs_to_mutate),
            specializations=specializations,
        )
        if sidecar_dir is None:
            _compat.maybe_warn_sidecar_env_ignored()
        handles = debug_handle_map(converted.graph, bindings.get("function", _upstream.MAIN_ENTRYPOINT))

        aot = _compat.get_compile_spec(compile_specs, _KEYS.AOT_COMPILE_CONFIG) is not None
        min_os = None if aot else _compat.min_os_version(compile_specs)
        with TemporaryDirectory() as staging:
            bundles = Path(staging) / "bundles"  # exactly the bundles the manifest declares
            aimodel = bundles / "model.aimodel"
            created = _upstream.write_program(program, aimodel, min_os)
            del program  # the IR holds a copy of the weights; release it before reading back
            model_hash = _upstream.finish_asset(created)
            if aot:
                result = _upstream.deliver_aot_compiled(aimodel, model_hash, compile_specs, sidecar_dir, bindings)
            else:
                beside = Path(staging) / "beside"
                manifest = {
                    "path": f"{model_hash}/model.aimodel",
                    "min_deployment_version": _compat.os_version_text(min_os),
                    **bindings,
                    **stage_initial_state(edge_program, beside),
                }
                # Inline, the asset streams from disk into the .pte, never read whole.
                packaging = _Packaging.INLINE if sidecar_dir is None else _Packaging.SIDECAR
                result = _upstream.deliver(bundles, model_hash, packaging, manifest, sidecar_dir, beside)
        result.debug_handle_map = handles
        return result


BACKEND_ID = CoreAICompositeBackend.__name__
