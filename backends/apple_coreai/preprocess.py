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
  partitioner put it (:mod:`coreai_partitioner.records.carried`);
* it returns a ``debug_handle_map`` (:mod:`.debug_handles`), so ExecuTorch's
  Inspector maps the delegate's profiling events to the edge graph.

Delivery (inline named data under ``coreai/<hash>/`` with its JSON manifest,
sidecar through ``COREAI_SIDECAR_DIR``, AOT ``.aimodelc`` through
``xcrun coreai-build``) and the manifest (version 2: ordered I/O names, each
file's size, a digest per bundle, which upstream's on-device runtime
requires) mirror upstream's ``CoreAIBackend`` (:mod:`.deliver`, :mod:`.manifest`).
"""

from __future__ import annotations

import json
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Dict, List, Tuple, final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from coreai_partitioner import _compat
from .manifest import MAIN_ENTRYPOINT, bindings, coreai_io_names
from .asset import finish_asset, write_program
from .deliver import deliver, deliver_aot_compiled, external_data_tag, sidecar_dir
from coreai_partitioner.records.programs import with_own_graph

from . import debug_info
from .debug_handles import debug_handle_map
from .convert import convert_functions
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
        return _preprocess_functions({MAIN_ENTRYPOINT: (edge_program, compile_specs)})[MAIN_ENTRYPOINT]

    @classmethod
    def preprocess_multimethod(
        cls,
        edge_programs: Dict[str, List[ExportedProgram]],
        compile_specs: Dict[str, List[List[CompileSpec]]],
    ) -> Dict[str, List[PreprocessResult]]:
        """One asset for every method's delegates, a function each, when the partitioner asked for it (``share_asset``).

        A method's one delegate runs the function named after it; several
        (graph breaks) run ``<method>_<i>``.  Otherwise each delegate is
        preprocessed on its own, as ExecuTorch's default does.
        """
        shared = [
            method for method, specs in compile_specs.items() if any(_shares_asset(s) for s in specs)
        ]
        if not shared:
            return super().preprocess_multimethod(edge_programs, compile_specs)
        delegates = {}
        for method, programs in edge_programs.items():
            if method not in shared:
                raise ValueError(f"share_asset: every method lowered together must ask for it; {method!r} does not")
            for index, program in enumerate(programs):
                delegates[function_name(method, index, len(programs))] = (program, compile_specs[method][index])
        results = _preprocess_functions(delegates)
        return {
            method: [results[function_name(method, i, len(programs))] for i in range(len(programs))]
            for method, programs in edge_programs.items()
        }


def function_name(method: str, index: int, count: int) -> str:
    """The asset function of a method's ``index``-th of ``count`` delegates in a shared asset."""
    return method if count == 1 else f"{method}_{index}"


#: Compile spec of delegates that share one asset, a function each (:meth:`CoreAICompositeBackend.preprocess_multimethod`).
SHARE_ASSET_KEY = "coreai_partitioner.share_asset"


def _shares_asset(compile_specs: List[CompileSpec]) -> bool:
    return any(spec.key == SHARE_ASSET_KEY for spec in compile_specs)


def _preprocess_functions(delegates: Dict[str, Tuple[ExportedProgram, List[CompileSpec]]]) -> Dict[str, PreprocessResult]:
    """Convert the delegates to one asset, a function each by its key, and ship it once; a manifest per delegate."""
    first_specs = next(iter(delegates.values()))[1]
    sidecar = sidecar_dir(first_specs)
    converted = {function: with_own_graph(program) for function, (program, _) in delegates.items()}
    program = convert_functions(converted, debug_info.requested(first_specs))

    function_bindings: dict[str, dict] = {}
    handles: dict[str, dict] = {}
    for function, (edge_program, compile_specs) in delegates.items():
        assert_io_compatible(program, converted[function], function)  # its state writes in Core AI's state order
        input_names, output_names = coreai_io_names(program, function)  # before enumerated shapes replace it
        raw_enumerations = _compat.get_compile_spec(compile_specs, _KEYS.INPUT_ENUMERATIONS)
        if raw_enumerations and len(delegates) > 1:
            raise ValueError(
                "share_asset with input_enumerations: a shared asset's functions are the methods themselves; "
                "give each method its own static shapes instead of enumerating them"
            )
        specializations = (
            _compat.apply_enumerated_shapes(program, edge_program, json.loads(raw_enumerations.decode()))
            if raw_enumerations
            else None
        )
        signature = edge_program.graph_signature
        function_bindings[function] = bindings(
            input_names,
            output_names,
            stateful=bool(signature.buffers_to_mutate or signature.user_inputs_to_mutate),
            specializations=specializations,
            function=function,
        )
        handles[function] = debug_handle_map(converted[function].graph, function_bindings[function].get("function", function))
    if sidecar is None:
        _compat.maybe_warn_sidecar_env_ignored()

    aot = _compat.get_compile_spec(first_specs, _KEYS.AOT_COMPILE_CONFIG) is not None
    min_os = None if aot else _compat.min_os_version(first_specs)
    first, (first_program, _) = next(iter(delegates.items()))
    with TemporaryDirectory() as staging:
        bundles = Path(staging) / "bundles"  # exactly the bundles the manifest declares
        aimodel = bundles / "model.aimodel"
        created = write_program(program, aimodel, min_os)
        del program  # the IR holds a copy of the weights; release it before reading back
        model_hash = finish_asset(created)
        if aot:
            result = deliver_aot_compiled(aimodel, model_hash, first_specs, sidecar, function_bindings[first])
        else:
            beside = Path(staging) / "beside"
            initial_state: dict = {}
            for edge_program, _ in delegates.values():
                initial_state.update(stage_initial_state(edge_program, beside).get("initial_state", {}))
            manifest = {
                "path": f"{model_hash}/model.aimodel",
                "min_deployment_version": _compat.os_version_text(min_os),
                **function_bindings[first],
                **({"initial_state": initial_state} if initial_state else {}),
            }
            # Inline, the asset streams from disk into the .pte, never read whole.
            packaging = _Packaging.INLINE if sidecar is None else _Packaging.SIDECAR
            result = deliver(bundles, model_hash, packaging, manifest, sidecar, beside, external_data_tag(first_specs))
    results = {first: result}
    shipped = json.loads(result.processed_bytes)
    for function in list(delegates)[1:]:
        # The same files under the same keys, stored once: only the first result carries the named data.
        manifest = {key: value for key, value in shipped.items() if key not in function_bindings[first]}
        manifest.update(function_bindings[function])
        results[function] = PreprocessResult(processed_bytes=json.dumps(manifest).encode("utf-8"))
    for function, result in results.items():
        result.debug_handle_map = handles[function]
    return results


BACKEND_ID = CoreAICompositeBackend.__name__
