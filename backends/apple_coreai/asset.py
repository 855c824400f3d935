"""Converting and writing a delegate's Core AI asset so that every build of one model is the same bytes.

Mirrors ExecuTorch 1.5.1's ``_prepare_program_for_conversion``
(:func:`to_aten`), coreai-torch 0.4.3's ``_constant_from_tensor`` and
``strip_debug_info`` (:class:`BuildIndependentConverter`,
:func:`strip_debug_info`) and coreai-core 1.0.0b3's ``AIProgram.save_asset``
(:func:`write_program`, :func:`finish_asset`); each says how it differs.
Private names come from :mod:`coreai_partitioner._compat`.  On the next
release of any of them, diff this file against theirs.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.export import ExportedProgram

from coreai_partitioner import _compat

def to_aten(program: ExportedProgram) -> ExportedProgram:
    """Upstream's ``_prepare_program_for_conversion``, in place on a program the caller owns.

    Upstream deep-copies the program (weights included) first; the backend
    hands this a copy of the graph only.  Node names are kept.
    """
    for node in program.graph.nodes:
        if node.op == "call_function":
            node.target = _compat.aten_op(node.target)
            # a *_copy view op, edge or ATen, as the functional op coreai-torch converts (upstream's
            # ReplaceCopyOpsWithFunctionalPass maps only edge ones)
            functional = _compat.functional_copy_op(node.target)
            if functional is not None and _compat.is_coreai_supported_target(functional):
                node.target = functional
    program.graph_module.recompile()
    return program


_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}


_PLAIN = {torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16, torch.int32, torch.bool}


_OWN_BLOB_NAME = "weight_{}"
_OWN_BLOB = re.compile(r"weight_\d+")

_RESOURCE_MIN_ELEMENTS = 256  # below this, or when splat, coreai-core keeps constants inline


class BuildIndependentConverter(_compat.TorchConverterBase):
    """``TorchConverter`` whose weight constants do not depend on the process.

    Mirrors coreai-torch's ``_constant_from_tensor`` (as :meth:`constant`, which
    ``_compat.TorchConverterBase`` calls from it).  coreai-core names every
    weight blob after a hash seeded per process, and the names reach the
    asset's bytecode, so two builds of one model differed.  Here a weight that
    coreai-core would keep as a blob (256 elements or more, not a splat)
    becomes a blob named ``weight_<n>`` in creation order, over the tensor's
    own memory where its dtype allows (no copy); a sub-byte weight (int4) is
    its bit-packed bytes, as coreai-torch embeds them.  Everything else (float8,
    small or splat constants) is coreai-torch's own.  ``stack_traces=False`` is
    coreai-torch's ``Mode.RELEASE`` (operation IDs only).
    """

    def __init__(self, *, stack_traces: bool = True) -> None:
        mode = _compat.TorchConverter.Mode.DEBUG if stack_traces else _compat.TorchConverter.Mode.RELEASE
        super().__init__(mode=mode)
        self._weights = 0

    def constant(self, tensor: torch.Tensor, location: Any) -> Any:
        dtype = getattr(tensor, "future_dtype", tensor.dtype)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        api = _compat.coreai_constant_api()
        if hasattr(tensor, "elem"):  # sub-byte (int4): coreai-torch embeds the bit-packed bytes of .elem as they are
            array = api.validate_and_cast_numpy_array(tensor.elem.detach().cpu().contiguous().numpy())
        elif dtype != tensor.dtype or dtype not in _PLAIN | set(_NARROW):
            return None
        else:
            array = api.validate_and_cast_numpy_array(_numpy_view(tensor.detach().cpu().contiguous()))
        if array.size < _RESOURCE_MIN_ELEMENTS or _is_splat(array):
            return None
        attr = api.DenseResourceElementsAttr.get_from_buffer(
            array,
            _OWN_BLOB_NAME.format(self._weights),
            api.get_tensor_type(tensor, location, dtype=dtype),
            alignment=16,
        )
        self._weights += 1
        return api.ConstantOp(value=attr).result


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


_BLOB_NAME = re.compile(r"dense_resource<([^>]+)>")


def name_folded_blobs(program: Any) -> None:
    """Name every weight blob that coreai-core's optimizer made ``constant_<n>``, in program order, in place.

    The optimizer ``to_coreai`` runs folds ops over constants into new blobs
    (a depthwise conv1d's weight given the height axis Core AI's conv2d takes),
    named after a hash seeded per process, so two builds of one model
    differed.  A blob :class:`BuildIndependentConverter` named (``weight_<n>``)
    is left as it is; every other one is made again under its new name from
    its bytes, and every op that held it holds the new one.
    """
    api = _compat.coreai_constant_api()
    renamed: dict[str, Any] = {}
    for operation in _compat.nested_operations(_compat.mlir_module(program)[1].operation):
        for named in list(operation.attributes):
            attr = named.attr
            if not api.DenseResourceElementsAttr.isinstance(attr):
                continue
            name = _BLOB_NAME.match(str(attr)).group(1)
            if _OWN_BLOB.fullmatch(name):
                continue
            if name not in renamed:
                data, alignment = _compat.resource_blob(operation, name)
                renamed[name] = api.DenseResourceElementsAttr.get_from_buffer(
                    np.frombuffer(data, dtype=np.uint8), f"constant_{len(renamed)}", attr.type, alignment=alignment,
                    context=operation.context,
                )
            operation.attributes[named.name] = renamed[name]


def strip_debug_info(program: Any, *, keep_op_ids: bool) -> None:
    """coreai-torch's ``debugging.debug_info.strip_debug_info``, with operation IDs optional.

    Every op's location becomes coreai-torch's unknown debug location: with a
    sequential operation ID when ``keep_op_ids`` (what coreai-torch's own
    function does), with no metadata otherwise.  In place.
    """
    module_op = _compat.mlir_module(program)[1].operation
    context = module_op.context
    source = _compat.CoreAILocation.file(filename="", line=0, col=0, context=context)
    _compat.set_op_location(module_op, _compat.unknown_location(None, source, context))
    for index, operation in enumerate(_compat.nested_operations(module_op)):
        operation_id = _compat.OperationID(type="coreai", value=index) if keep_op_ids else None
        location = _compat.unknown_location(operation_id, source, context)
        _compat.set_op_location(operation, location)
        for region in operation.regions:
            for block in region:
                for argument in block.arguments:
                    _compat.set_block_arg_location(argument, location)


def write_program(program: Any, path: Path, minimum_os: Any) -> Any:
    """``AIProgram.save_asset`` without its clone of the IR and its creation date.

    ``save_asset`` serializes a clone of the IR, then reads the whole bytecode
    back to hash it while the IR is still alive, and stamps the wall-clock
    time into ``metadata.json``.  This writes the program itself (the caller
    drops it right after), so the IR can be released before
    :func:`finish_asset` reads anything back.  Returns the created asset.
    """
    from coreai.authoring import OSVersion

    api = _compat.coreai_asset_api()
    minimum_os = minimum_os or OSVersion.v27
    path.mkdir(parents=True)
    created = api.create(path=str(path), metadata=None)
    module, mlir_module = _compat.mlir_module(program)
    module.verify()
    bytecode_path, _ = _compat.asset_paths(created)
    api.serialize_module_to_bytecode(
        module=mlir_module,
        package_path=bytecode_path,
        dialect_version=api.dialect_version_for_os(minimum_os.value),
        bytecode_version=api.bytecode_version,
    )
    return created


def finish_asset(created: Any) -> str:
    """Stamp the producer, hash the bytecode in chunks; returns the hash (``main.hash``) as hex.

    ``metadata.json`` is rewritten with sorted keys: coreai-core writes them in
    an order that changes from process to process.
    """
    producer = _compat.coreai_asset_api().producer
    created.update_metadata(updates=lambda metadata: _compat.set_producer(metadata, producer))
    metadata_path = created.path / "metadata.json"
    metadata_path.write_text(json.dumps(json.loads(metadata_path.read_text()), indent=2, sort_keys=True) + "\n")
    bytecode_path, hash_path = _compat.asset_paths(created)
    digest = hashlib.sha256()
    with open(bytecode_path, "rb") as bytecode:
        for chunk in iter(lambda: bytecode.read(1 << 22), b""):
            digest.update(chunk)
    hash_path.write_bytes(digest.digest())
    return digest.hexdigest()
