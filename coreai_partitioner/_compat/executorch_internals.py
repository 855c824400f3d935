"""ExecuTorch's private names, imported on first use (importing ExecuTorch imports torchao, which logs): the Core AI
backend's compiler and partitioner, serialization's views of a ``.pte`` and a ``.ptd``, edge ops and configs."""

from __future__ import annotations

import importlib
from typing import Any

_APPLE = "executorch.backends.apple.coreai"


_PREPROCESS = f"{_APPLE}.compiler.preprocess"


_PARTITIONER = f"{_APPLE}.partition.partitioner"


#: ExecuTorch's names, imported on first use: ``name here: (module, name there)``; ``None`` is the module itself.
_EXECUTORCH = {
    "upstream_compile_config": (_APPLE, "get_default_compile_config"),
    "get_default_passes": (_APPLE, "get_default_passes"),
    "_apply_enumerated_shapes": (f"{_APPLE}.compiler.enumerated_shapes", "apply_enumerated_shapes"),
    "resolve_input_enumerations": (f"{_APPLE}.compiler.enumerated_shapes", "resolve_input_enumerations"),
    "edge_io": (f"{_APPLE}.compiler.io_compat", "_edge_io"),
    "io_mismatches": (f"{_APPLE}.compiler.io_compat", "io_mismatches"),
    "_upstream_preprocess": (_PREPROCESS, None),
    "ASSET_ALIGNMENT": (_PREPROCESS, "_ASSET_ALIGNMENT"),
    "COMPILE_SPEC_KEYS": (_PREPROCESS, "COMPILE_SPEC_KEYS"),
    "SIDECAR_DIR_ENV": (_PREPROCESS, "SIDECAR_DIR_ENV"),
    "AssetPackaging": (_PREPROCESS, "AssetPackaging"),
    "aot_compile_options": (_PREPROCESS, "_aot_compile_options"),
    "compiled_arch_bundles": (_PREPROCESS, "_compiled_arch_bundles"),
    "get_compile_spec": (_PREPROCESS, "_get_compile_spec"),
    "maybe_warn_sidecar_env_ignored": (_PREPROCESS, "_maybe_warn_sidecar_env_ignored"),
    "min_os_version": (_PREPROCESS, "_min_os_version"),
    "named_data_key": (_PREPROCESS, "_nds_key"),
    "os_version_text": (_PREPROCESS, "_os_version_text"),
    "reject_existing_asset_dir": (_PREPROCESS, "_reject_existing_asset_dir"),
    "DO_NOT_DELEGATE_TAG": (_PARTITIONER, "DO_NOT_DELEGATE_TAG"),
    "UpstreamCoreAIPartitioner": (_PARTITIONER, "CoreAIPartitioner"),
    "node_tensor_vals": (_PARTITIONER, "_node_tensor_vals"),
    "UpstreamOperatorSupport": (_PARTITIONER, "_OperatorsSupportedForCoreAIBackend"),
    "do_not_delegate": (_PARTITIONER, "do_not_delegate"),
    "is_coreai_supported_target": (_PARTITIONER, "is_coreai_supported_target"),
    "FileBackedData": ("executorch.exir._serialize._cord", "FileBackedData"),
    "NamedDataStore": ("executorch.exir._serialize._named_data_store", "NamedDataStore"),
    "_flatbuffer_to_program": ("executorch.exir._serialize._program", "_flatbuffer_to_program"),
    "_get_extended_header": ("executorch.exir._serialize._program", "_get_extended_header"),
    "_restore_delegates": ("executorch.exir._serialize._program", "_restore_delegates"),
    "EdgeOpOverload": ("executorch.exir.dialects.edge._ops", "EdgeOpOverload"),
    "aten_to_edge_program": ("executorch.exir.program._program", "_generate_edge_program"),
    "default_decomposition_table": ("executorch.exir.tracer", "_default_decomposition_table"),
    "add_delegation_info": ("executorch.export.stages", "_add_delegation_info_context"),
    "edge_ops": ("executorch.exir.dialects._ops", "ops"),
}


def _executorch(name: str) -> Any:
    """One of ExecuTorch's names of :data:`_EXECUTORCH`, imported on first use and kept as a global."""
    found = globals().get(name)
    if found is None:
        module, attribute = _EXECUTORCH[name]
        found = importlib.import_module(module)
        if attribute is not None:
            found = getattr(found, attribute)
        globals()[name] = found
    return found


def edge_manager_like(edge: Any, programs: dict) -> Any:
    """An ``EdgeProgramManager`` of ``edge``'s class, constant methods and configs over other edge ``programs``."""
    import copy

    manager = copy.copy(edge)  # the class and its configs; EdgeProgramManager(...) would verify every program again
    manager._edge_programs = dict(programs)
    return manager


def without_opset_check(config: Any) -> Any:
    """``config`` (an ``EdgeCompileConfig``) with ExecuTorch's IR check off (its private ``_check_ir_validity``)."""
    config._check_ir_validity = False
    return config


def aten_op(target: Any) -> Any:
    """The ATen overload behind an edge-dialect op (``target`` itself otherwise)."""
    return target._op if isinstance(target, _executorch("EdgeOpOverload")) else target


def functional_copy_op(target: Any) -> Any:
    """The functional ATen overload of a ``*_copy`` view op, edge or ATen (``view_copy.default`` -> ``view.default``),
    or None.  Upstream's ``functional_aten_op`` maps only edge ops; a program partitioned on ATen IR has ATen ones
    where functionalization could not keep a view (a view of a permuted tensor)."""
    op_name, _, overload = getattr(aten_op(target), "__name__", "").partition(".")
    if not op_name.endswith("_copy") or op_name == "_to_copy":
        return None
    import torch

    packet = getattr(torch.ops.aten, op_name[: -len("_copy")], None)
    return getattr(packet, overload or "default", None) if packet is not None else None


def converted_op(target: Any) -> Any:
    """The ATen overload coreai-torch converts for ``target``: a ``*_copy`` op's functional form
    (``squeeze_copy.dims`` is converted as ``squeeze.dims``), else :func:`aten_op`."""
    return functional_copy_op(target) or aten_op(target)


def set_backend_id(lowered: Any, backend_id: str) -> None:
    """Give an ExecuTorch ``LoweredBackendModule`` another backend id (it has no setter)."""
    lowered._backend_id = backend_id


def backing_file(data: Any) -> str:
    """The path an ExecuTorch ``FileBackedData`` reads from."""
    return data._path


def tensor_data_files(program: Any) -> dict[str, Any]:
    """The data files (``.ptd``) an ``ExecutorchProgramManager`` serialized, by name: what its
    ``write_tensor_data_to_file`` writes (ExecuTorch 1.5.1 keeps them in ``_tensor_data``)."""
    return dict(getattr(program, "_tensor_data", None) or {})


def base_compile_specs(partitioner: Any) -> list:
    """The compile specs upstream's ``CoreAIPartitioner.__init__`` built from its options."""
    return partitioner._base_compile_specs


def input_enumerations(partitioner: Any) -> Any:
    """The ``input_enumerations`` option upstream's ``CoreAIPartitioner`` keeps."""
    return partitioner._input_enumerations


class _GetGraphProgram:
    """An ``AIProgram`` with ``get_graph``: coreai-core 1.0.0b3 renamed it ``_get_graph``
    and upstream's enumerated_shapes still calls the old name.  It keeps the shape
    configuration upstream attaches, which upstream's later releases return."""

    def __init__(self, program: Any) -> None:
        self._program = program
        self.shapes: dict[str, dict[str, tuple]] = {}

    def get_graph(self, entrypoint: str) -> Any:
        return self._program._get_graph(entrypoint)

    def set_static_shape_config(self, entrypoint: str, shapes: dict) -> None:
        self.shapes = dict(shapes)
        self._program.set_static_shape_config(entrypoint, shapes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._program, name)


def apply_enumerated_shapes(program: Any, edge_program: Any, enumerations: dict) -> dict[str, dict[str, tuple]]:
    """Upstream's enumerated-shape attachment, on a coreai-core 1.0.0b3 ``AIProgram``.

    Returns ``{specialization key: {input name: shape}}`` (empty when nothing
    was specialized); the function of key ``k`` is ``main_<k>``.
    """
    wrapped = _GetGraphProgram(program)
    _executorch("_apply_enumerated_shapes")(wrapped, edge_program, enumerations)
    return wrapped.shapes


def run_coreai_build(aimodel: Any, out_dir: Any, options: dict) -> None:
    """Upstream's ``xcrun coreai-build`` step, looked up when called (tests patch it there)."""
    _executorch("_upstream_preprocess")._run_coreai_build(aimodel, out_dir, options)


def deserialize_pte_views(data: memoryview) -> tuple[Any, dict[str, memoryview]]:
    """A ``.pte``'s Program and its named data as views of ``data``, not copies.

    ``deserialize_pte_binary`` copies the whole segment region, then each
    segment, and its NamedDataStore takes only ``bytes``.  Here only the
    flatbuffer (no weights) is copied; delegate payloads stored as segments
    are restored as upstream does.
    """
    header = _executorch("_get_extended_header")(data)
    program_size = header.program_size if header else len(data)
    program = _executorch("_flatbuffer_to_program")(bytes(data[:program_size]))
    if not header or header.segment_base_offset == 0:
        return program, {}
    base = header.segment_base_offset
    segments = [data[base + s.offset : base + s.offset + s.size] for s in program.segments]
    program = _executorch("_restore_delegates")(program, segments)
    return program, {entry.key: segments[entry.segment_index] for entry in program.named_data or ()}


def deserialize_ptd_views(data: memoryview) -> dict[str, memoryview]:
    """A data file's (``.ptd``, ExecuTorch's flat tensor format) named data as views of ``data``, not copies."""
    from executorch.extension.flat_tensor.serialize import serialize as flat_tensor

    header = flat_tensor.FlatTensorHeader.from_bytes(bytes(data[8 : 8 + flat_tensor.FlatTensorHeader.EXPECTED_LENGTH]))
    if not header.is_valid():
        raise ValueError("not an ExecuTorch data file (.ptd): its header is not the flat tensor format's")
    table = bytes(data[: header.flatbuffer_offset + header.flatbuffer_size])  # the flatbuffer's root is at 0
    contents = flat_tensor._deserialize_to_flat_tensor(table)
    base = header.segment_base_offset
    segments = [data[base + s.offset : base + s.offset + s.size] for s in contents.segments]
    return {entry.key: segments[entry.segment_index] for entry in contents.named_data}
