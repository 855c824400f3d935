"""Every private name this project takes from coreai-torch, coreai-core, ExecuTorch and torch.

Keeping them in one module means the next release of any of those packages
touches this file (and :mod:`coreai_partitioner._upstream`, the code mirrored
from them) only; ``tests/test_private_names.py`` holds every other module to
it.  Pinned: torch 2.13.0, executorch 1.5.1, coreai-torch 0.4.3,
coreai-core 1.0.0b3.

Importing this module imports torch, coreai-torch and coreai-core, never
ExecuTorch: ExecuTorch imports torchao, which logs at import, and
:func:`coreai_partitioner.console.quiet_dependencies` reads
:data:`PRIVATE_LOGGERS` here before anything logs.  ExecuTorch's names
(:data:`_EXECUTORCH`) are imported on first use, as ``_compat.<name>``.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from typing import Any

import torch

with warnings.catch_warnings():
    # coreai-torch compares "2.13.0+cpu" > "2.13.0" and warns on the very release it validated.
    warnings.filterwarnings("ignore", message="coreai-torch has only been validated")
    import coreai_torch  # noqa: F401

from coreai._compiler._mlir_libs._coreaiIR._bindings.mlir import set_block_arg_location, set_op_location
from coreai._compiler.ir import Location as CoreAILocation
from coreai_torch import TorchConverter
from coreai_torch._debug_locations import OperationID
from coreai_torch._debug_locations import _create_unknown_location_with_operation_id as unknown_location
from coreai_torch._debug_locations import _get_nested_operations as nested_operations
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
from torch._guards import detect_fake_mode
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._pytree import tree_flatten

#: Loggers named after private modules of torch, and the level a command line holds them to
#: (:func:`coreai_partitioner.console.quiet_dependencies`): torch's pytree notices while torchao
#: imports, torch.export's internals while a model exports.
PRIVATE_LOGGERS = {"torch.utils._pytree": logging.ERROR, "torch._export": logging.ERROR}

#: Attributes coreai-torch stamps on a submodule it patches for externalization, by prefix.
EXTERNALIZE_ATTR_PREFIXES = ("_externalize", "_original_forward")

#: coreai-torch's composite classes live in private modules named after the composite, but for SDPA's.
_COMPOSITE_NAME_OVERRIDES = {"_sdpa": "scaled_dot_product_attention"}

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
    "ReplaceCopyOpsWithFunctionalPass": (f"{_APPLE}.passes.replace_copy_ops", "ReplaceCopyOpsWithFunctionalPass"),
    "functional_aten_op": (f"{_APPLE}.passes.replace_copy_ops", "functional_aten_op"),
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


def __getattr__(name: str) -> Any:
    if name not in _EXECUTORCH:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _executorch(name)


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


def annotate_nodes(annotation: dict) -> Any:
    """``torch.fx.traceback.annotate``: ops traced inside get ``annotation`` in ``node.meta["custom"]``
    (kept only by a trace under :func:`preserve_node_meta`)."""
    from torch.fx.traceback import annotate

    return annotate(annotation)


def preserve_node_meta() -> Any:
    """``torch.fx.traceback.preserve_node_meta``: a trace keeps the annotations of :func:`annotate_nodes`."""
    from torch.fx.traceback import preserve_node_meta as preserve

    return preserve()


def acyclic_partition(nodes: list) -> bool:
    """``torch.fx.passes.utils.fuser_utils.validate_partition``: fusing ``nodes`` makes no dependency cycle."""
    from torch.fx.passes.utils.fuser_utils import validate_partition

    return validate_partition(nodes)


def upper_bound(size: Any) -> int | None:
    """The largest value a symbolic size of an exported program may take (its range constraint), or None if unbounded.

    Reads the size's ``ShapeEnv`` (``torch.fx.experimental.symbolic_shapes``, not public API).
    """
    if isinstance(size, int):
        return size
    node = getattr(size, "node", None)
    if node is None:
        return None
    upper = node.shape_env.bound_sympy(node.expr).upper
    return int(upper) if _finite(upper) else None


def _finite(bound: Any) -> bool:
    """A range end that is a number: torch's ``int_oo`` says ``is_finite`` too, so ask sympy's ``Integer``."""
    import sympy

    return isinstance(bound, sympy.Integer)


def fake_tensor_mode_of(program: Any) -> Any:
    """The fake-tensor mode ``program``'s placeholders were traced in (a new one if none)."""
    from torch._guards import detect_fake_mode

    values = [node.meta.get("val") for node in program.graph.nodes if node.op == "placeholder"]
    return detect_fake_mode([value for value in values if isinstance(value, torch.Tensor)]) or fake_mode()


def graph_signature_with_inputs(signature: Any, input_specs: list) -> Any:
    """``signature`` with ``input_specs`` in place of its own (``ExportGraphSignature`` is a dataclass)."""
    import dataclasses

    return dataclasses.replace(signature, input_specs=list(input_specs))


def exported_program_like(program: Any, graph_module: Any, signature: Any, constants: dict) -> Any:
    """An ``ExportedProgram`` of ``program``'s kind (dialect, verifiers) over another graph, signature and constants.

    Range constraints keep only the symbols the new graph's placeholders still have.
    """
    from torch.export import ExportedProgram

    symbols = set()
    for node in graph_module.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor):
            for size in value.shape:
                if isinstance(size, torch.SymInt):
                    symbols |= size.node.expr.free_symbols
    return ExportedProgram(
        root=graph_module,
        graph=graph_module.graph,
        graph_signature=signature,
        state_dict=program.state_dict,
        range_constraints={key: value for key, value in program.range_constraints.items() if key in symbols},
        module_call_graph=program.module_call_graph,
        example_inputs=None,
        constants=constants,
        verifiers=list(program.verifiers),
    )


def edge_manager_like(edge: Any, programs: dict) -> Any:
    """An ``EdgeProgramManager`` of ``edge``'s class, constant methods and configs over other edge ``programs``."""
    import copy

    manager = copy.copy(edge)  # the class and its configs; EdgeProgramManager(...) would verify every program again
    manager._edge_programs = dict(programs)
    return manager


def fake_mode() -> Any:
    """A fake-tensor mode with a shape environment, taking real (or meta) tensors as inputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())


def sym_expr(size: Any) -> Any:
    """A size as torch's shape environment sees it: the sympy expression of a SymInt, an int as it is."""
    return size.node.expr if isinstance(size, torch.SymInt) else size


def unbacked_symbols(value: Any) -> set:
    """The data-dependent symbols (``u0``: ``nonzero``'s count, an ``item()``) in a node's value's sizes, or in it."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    parts = value if isinstance(value, (tuple, list)) else (value,)
    return set().union(*(free_unbacked_symbols(part) for part in parts if isinstance(part, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool))))


def symbol_range(size: torch.SymInt, symbol: Any) -> tuple[str, str]:
    """The value range ``size``'s shape environment gives ``symbol`` (``("?", "?")`` when it has none)."""
    bounds = size.node.shape_env.var_to_range.get(symbol)
    return (str(bounds.lower), str(bounds.upper)) if bounds is not None else ("?", "?")


def unbounded_data_dependent_sizes(program: Any) -> dict:
    """``{symbol: node name}``: each data-dependent symbol in a tensor size of ``program`` with no finite upper bound.

    ExecuTorch plans memory for a size's largest value (``exir.sym_util.eval_upper_bound``); such a symbol has none.
    """
    return {symbol: name for symbol, (name, _) in _unbounded(program).items()}


def bound_data_dependent_sizes(program: Any, largest: int) -> dict:
    """Give each symbol of :func:`unbounded_data_dependent_sizes` the range ``[its lower bound, largest]``.

    Through the shape environment's ``constrain_symbol_range``, as ``torch._check(n <= largest)`` in the model
    would; returns what it bounded.
    """
    found = _unbounded(program)
    for symbol, (_, env) in found.items():
        lower = env.var_to_range[symbol].lower if symbol in env.var_to_range else 0
        env.constrain_symbol_range(symbol, int(lower) if _finite(lower) else 0, largest)
    return {symbol: name for symbol, (name, _) in found.items()}


def _unbounded(program: Any) -> dict:
    """``{symbol: (first node name, its shape environment)}`` for :func:`unbounded_data_dependent_sizes`."""
    found = {}
    for node in program.graph.nodes:
        for part in _tensors(node.meta.get("val")):
            for size in part.shape:
                if isinstance(size, torch.SymInt):
                    env = size.node.shape_env
                    for symbol in unbacked_symbols(size):
                        bounds = env.var_to_range.get(symbol)
                        if bounds is None or not _finite(bounds.upper):
                            found.setdefault(symbol, (node.name, env))
    return found


def _tensors(value: Any) -> list:
    parts = value if isinstance(value, (tuple, list)) else (value,)
    return [part for part in parts if isinstance(part, torch.Tensor)]


def export_decomposed(
    module: torch.nn.Module, args: tuple, dynamic_shapes: Any, decompositions: dict
) -> torch.export.ExportedProgram:
    """``torch.export.export(...).run_decompositions(decompositions)`` in one trace instead of two.

    torch 2.13's ``torch.export._trace._export(pre_dispatch=False)`` traces to
    functional ATen IR through ``_export_to_aten_ir``, whose ``decomp_table``
    ``run_decompositions`` fills on its own re-trace; here the first trace
    applies it.  Not thread-safe: the module's function is swapped for the call.
    """
    import functools

    from torch.export import _trace

    to_aten = _trace._export_to_aten_ir
    _trace._export_to_aten_ir = functools.partial(to_aten, decomp_table=decompositions)
    try:
        return _trace._export(module, args, dynamic_shapes=dynamic_shapes, strict=False, pre_dispatch=False)
    finally:
        _trace._export_to_aten_ir = to_aten


def compression_ops() -> Any:
    """``torch.ops.coreai``, with coreai-torch's compression ops (``lut_to_dense``,
    ``constexpr_blockwise_shift_scale``) registered: they live in its private ``_compression``."""
    from coreai_torch._compression import custom_layers  # noqa: F401 - registers the ops

    return torch.ops.coreai


def without_opset_check(config: Any) -> Any:
    """``config`` (an ``EdgeCompileConfig``) with ExecuTorch's IR check off (its private ``_check_ir_validity``)."""
    config._check_ir_validity = False
    return config


def return_types_as_tuples(program: Any) -> None:
    """Make a ``torch.return_types`` result (``torch.median(x, dim)``'s ``(values, indices)``) a plain tuple in
    ``program``'s output spec: ExecuTorch's emitter cannot name the type ("No registered serialization name for
    <class 'torch.return_types.median'>"), and its runtime returns a flat list of outputs either way."""
    from torch.utils import _pytree

    def plain(spec: Any) -> Any:
        if spec.is_leaf():
            return spec
        children = [plain(child) for child in spec.children()]
        if _pytree.is_structseq_class(spec.type):
            return _pytree.TreeSpec(tuple, None, children)
        return _pytree.TreeSpec(spec.type, spec.context, children)

    for entry in program.module_call_graph[:1]:
        if entry.signature is not None:
            entry.signature.out_spec = plain(entry.signature.out_spec)


def aten_op(target: Any) -> Any:
    """The ATen overload behind an edge-dialect op (``target`` itself otherwise)."""
    return target._op if isinstance(target, _executorch("EdgeOpOverload")) else target


def converted_op(target: Any) -> Any:
    """The ATen overload coreai-torch converts for ``target``: an edge ``*_copy`` op's functional form
    (``squeeze_copy.dims`` is converted as ``squeeze.dims``), else :func:`aten_op`."""
    return _executorch("functional_aten_op")(target) or aten_op(target)


def op_schema(target: Any) -> Any:
    """The ``FunctionSchema`` of an op overload (ATen or edge), or None for a target that has none."""
    return getattr(target, "_schema", None)


def composite_op_name(cls: type) -> str:
    """The Core AI composite name of a ``coreai_torch.composite_ops`` class: its private module's name."""
    module = cls.__module__.rsplit(".", 1)[-1]
    return _COMPOSITE_NAME_OVERRIDES.get(module, module.lstrip("_"))


def set_backend_id(lowered: Any, backend_id: str) -> None:
    """Give an ExecuTorch ``LoweredBackendModule`` another backend id (it has no setter)."""
    lowered._backend_id = backend_id


def backing_file(data: Any) -> str:
    """The path an ExecuTorch ``FileBackedData`` reads from."""
    return data._path


class TorchConverterBase(TorchConverter):
    """coreai-torch's ``TorchConverter`` with the two private parts this project uses as public methods.

    :meth:`add_program` hands coreai-torch a program's externalized records
    (``add_exported_program``'s private ``_externalized_exported_programs``);
    a subclass's :meth:`constant` may make a weight constant itself, where
    coreai-torch makes each in its private ``_constant_from_tensor``.
    """

    def add_program(self, program: Any, entrypoint_name: str, records: list | None) -> None:
        self.add_exported_program(program, entrypoint_name=entrypoint_name, _externalized_exported_programs=records)

    def constant(self, tensor: torch.Tensor, location: Any) -> Any:
        """The MLIR value of a weight constant, at ``location``; None leaves it coreai-torch's."""
        return None

    def _constant_from_tensor(self, tensor: torch.Tensor) -> Any:
        made = self.constant(tensor, self._location)
        return super()._constant_from_tensor(tensor) if made is None else made


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


def externalized_op_of(module: torch.nn.Module) -> tuple[str, Any]:
    """``(op name, original forward)`` coreai-torch stamped on a patched submodule."""
    return module._externalize_op_name, module._original_forward


def module_state(module: torch.nn.Module) -> tuple[dict, dict, set]:
    """A module's own parameters and buffers (``None`` entries included), and its non-persistent buffer names."""
    return module._parameters, module._buffers, module._non_persistent_buffers_set


#: ``nn.Module`` attributes that hold its internals, not its configuration.
MODULE_INTERNAL_ATTRS = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "training"})
#: ``nn.Module`` attributes that hold hooks.
MODULE_HOOK_ATTRS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


def has_forward_hooks(module: torch.nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def coreai_graph(program: Any, entrypoint: str) -> Any:
    """One entrypoint's graph of a coreai-core ``AIProgram`` (``arg_attrs``, ``res_attrs``, ``function_type``)."""
    return program._get_graph(entrypoint)


def graph_function_type(program: Any, entrypoint: str) -> Any:
    """The MLIR function type of one entrypoint of a coreai-core ``AIProgram``."""
    return coreai_graph(program, entrypoint).function_type.value


def coreai_types() -> Any:
    """coreai-core's MLIR type classes the boundary check inspects."""
    from types import SimpleNamespace

    from coreai._compiler.dialects.coreai import HandleType, TokenType
    from coreai._compiler.ir import RankedTensorType

    return SimpleNamespace(HandleType=HandleType, TokenType=TokenType, RankedTensorType=RankedTensorType)


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


def coreai_constant_api() -> Any:
    """coreai-core and coreai-torch internals a weight constant is built from."""
    from types import SimpleNamespace

    from coreai._compiler.dialects import coreai as coreai_dialect
    from coreai._compiler.ir import DenseResourceElementsAttr
    from coreai_torch._utils import get_tensor_type, validate_and_cast_numpy_array

    return SimpleNamespace(
        ConstantOp=coreai_dialect.ConstantOp,
        DenseResourceElementsAttr=DenseResourceElementsAttr,
        get_tensor_type=get_tensor_type,
        validate_and_cast_numpy_array=validate_and_cast_numpy_array,
    )


def coreai_asset_api() -> Any:
    """coreai-core internals an ``.aimodel`` is written with."""
    from types import SimpleNamespace

    from coreai.authoring import asset as _asset
    from coreai.runtime import _AIModelAsset

    return SimpleNamespace(
        create=_AIModelAsset._create,
        dialect_version_for_os=_AIModelAsset._dialect_version_for_os,
        serialize_module_to_bytecode=_asset.serialize_module_to_bytecode,
        bytecode_version=_asset._CURRENT_BYTECODE_VERSION,
        producer=_asset._COREAI_PRODUCER,
    )


def runtime_debug_infos(model: Any) -> bytes:
    """A loaded ``coreai.runtime.AIModel``'s debug information (JSON: each compiled op's sources and call stack)."""
    return model._model._debug_infos


def mlir_module(program: Any) -> Any:
    """``(coreai module, its MLIR module)`` of an ``AIProgram``."""
    return program._module, program._module._mlir_module


def asset_paths(created: Any) -> tuple[Any, Any]:
    """``(bytecode path, hash path)`` of an asset ``coreai_asset_api().create`` made."""
    return created._program_bytecode_path, created._program_hash_path


def set_producer(metadata: Any, producer: str) -> None:
    metadata._producer = producer


def program_asm(program: Any, *, locations: bool = False) -> str:
    """The printed IR of an ``AIProgram``, large constants and weight blobs elided; op locations if asked."""
    return program._module._mlir_module.operation.get_asm(
        large_elements_limit=16, large_resource_limit=64, enable_debug_info=locations
    )


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


def t5_relative_position_bucket(attention: Any, relative: torch.Tensor, *, bidirectional: bool) -> torch.Tensor:
    """The bucket of each of ``relative`` (key position less query position) by transformers' T5
    (``T5Attention._relative_position_bucket``), with ``attention``'s bucket count and longest distance."""
    return type(attention)._relative_position_bucket(
        relative,
        bidirectional=bidirectional,
        num_buckets=attention.relative_attention_num_buckets,
        max_distance=attention.relative_attention_max_distance,
    )
