"""coreai-torch's and coreai-core's private names: the converter's externalization and debug locations, composites'
names, weight constants, the ``.aimodel`` asset, an ``AIProgram``'s graphs and printed IR.

Importing it imports coreai-torch without coreai-torch's false version warning.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
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


#: Attributes coreai-torch stamps on a submodule it patches for externalization, by prefix.
EXTERNALIZE_ATTR_PREFIXES = ("_externalize", "_original_forward")

#: Where coreai-torch keeps the forward of a submodule it patched (its own ``forward`` then calls the op).
EXTERNALIZED_FORWARD_ATTR = "_original_forward"


#: coreai-torch's composite classes live in private modules named after the composite, but for SDPA's.
_COMPOSITE_NAME_OVERRIDES = {"_sdpa": "scaled_dot_product_attention"}


def compression_ops() -> Any:
    """``torch.ops.coreai``, with coreai-torch's compression ops (``lut_to_dense``,
    ``constexpr_blockwise_shift_scale``) registered: they live in its private ``_compression``."""
    from coreai_torch._compression import custom_layers  # noqa: F401 - registers the ops

    return torch.ops.coreai


def int4_constant(packed: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """coreai-torch's ``IntxTensor`` over ``packed`` (int4 bytes in its layout, not copied): the constant its
    converter embeds as ``si4`` data of ``shape``, as its ``inject_subbyte_tensors`` makes one from int8 data."""
    from coreai_torch._compression._intx import IntxTensor

    return IntxTensor(packed.reshape(-1), shape, 4)


def composite_op_name(cls: type) -> str:
    """The Core AI composite name of a ``coreai_torch.composite_ops`` class: its private module's name."""
    module = cls.__module__.rsplit(".", 1)[-1]
    return _COMPOSITE_NAME_OVERRIDES.get(module, module.lstrip("_"))


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


@contextlib.contextmanager
def call_sites_found_in_one_walk(program: Any) -> Iterator[None]:
    """coreai-torch's ``_find_all_custom_op_nodes`` for ``program``, answered from one walk of its graph.

    Preparing the sub-exports asks for each externalized module's call sites
    twice, and each time coreai-torch walks every node of the whole-model
    graph: a decoder's graph is walked hundreds of times.  A node
    is one of an op's call sites when its target is that op's ``default``
    overload, as coreai-torch's match of the qualified name finds it.  The
    block must not change the graph.  Not thread-safe: the function is
    swapped in ``coreai_torch.externalize`` for the block.
    """
    from coreai_torch import externalize

    found: dict[str, list] = {}
    for node in program.graph.nodes:
        if node.op == "call_function":
            found.setdefault(str(node.target), []).append(node)
    walk = externalize._find_all_custom_op_nodes

    def call_sites(exported_program: Any, op_name: str) -> list:
        if exported_program is not program:
            return walk(exported_program, op_name)
        return list(found.get(f"{EXTERNALIZE_NAMESPACE}.{op_name}.default", ()))

    externalize._find_all_custom_op_nodes = call_sites
    try:
        yield
    finally:
        externalize._find_all_custom_op_nodes = walk


@contextlib.contextmanager
def graph_names_counted() -> Iterator[None]:
    """coreai-core's per-call graphs named from a count for the block, not at random.

    coreai-core builds a composite coreai-torch converts (``layer_norm``,
    ``sdpa_maskless``) as one graph per call and names each ``<op>_<8 letters>``
    drawn by ``secrets.choice``; the names reach the asset, so two builds of one
    model differed.  In the block the letters spell the graph's place in
    creation order (``aaaaaaaa``, ``aaaaaaab``, ...), still eight lowercase
    letters, as coreai-torch's debugging tools expect of the suffix.  Not
    thread-safe: the function is swapped in coreai-core's two builders.
    """
    from string import ascii_lowercase

    from coreai.authoring import func, graph_builder

    count = 0

    def counted(name: str) -> str:
        nonlocal count
        letters, left = [], count
        for _ in range(8):
            left, digit = divmod(left, len(ascii_lowercase))
            letters.append(ascii_lowercase[digit])
        count += 1
        return f"{name}_{''.join(reversed(letters))}"

    drawn = {module: module._randomize_fn_name for module in (graph_builder, func)}
    for module in drawn:
        module._randomize_fn_name = counted
    try:
        yield
    finally:
        for module, draw in drawn.items():
            module._randomize_fn_name = draw


def resource_blob(operation: Any, name: str) -> tuple[bytes, int]:
    """``(bytes, alignment)`` of the resource blob ``name`` that ``operation`` (a ``coreai.constant``) holds.

    coreai-core's bindings read no blob back; its text form prints one in hex
    (its alignment, 4 bytes little-endian, then the data).  The op is printed
    alone, cloned into a module of its own, so only its blob is printed.
    """
    from coreai._compiler import ir

    with operation.context, ir.Location.unknown():
        scratch = ir.Module.create()
        with ir.InsertionPoint(scratch.body):
            operation.clone()
        text = scratch.operation.get_asm(large_resource_limit=None)
    start = text.index(f'{name}: "0x', text.rindex("dialect_resources:")) + len(name) + 5
    payload = bytes.fromhex(text[start : text.index('"', start)])
    return payload[4:], int.from_bytes(payload[:4], "little")


def call_site_arguments(prep: Any) -> tuple[tuple, dict | None, Any]:
    """``(args, kwargs, dynamic_shapes)`` coreai-torch's ``_torch_export_module`` exports a call site's submodule
    with: its fake inputs, by keyword where the call skipped an optional argument."""
    import inspect

    source_node = prep.source_nodes[0]
    present = [i for i, a in enumerate(source_node.args) if a is not None]
    if present == list(range(len(prep.fake_inputs))):
        return tuple(prep.fake_inputs), None, prep.dynamic_shapes
    names = list(inspect.signature(prep.module.forward).parameters)
    kwargs = {names[position]: fake for position, fake in zip(present[1:], prep.fake_inputs[1:])}
    dynamic_shapes = {names[position]: shape for position, shape in zip(present, prep.dynamic_shapes)}
    return (prep.fake_inputs[0],), kwargs, dynamic_shapes


def externalized_op_name(module: torch.nn.Module) -> str | None:
    """The op coreai-torch registered for a submodule it patched, or None for one it did not patch."""
    return getattr(module, "_externalize_op_name", None)


def externalized_op_of(module: torch.nn.Module) -> tuple[str, Any]:
    """``(op name, original forward)`` coreai-torch stamped on a patched submodule."""
    return module._externalize_op_name, getattr(module, EXTERNALIZED_FORWARD_ATTR)


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
