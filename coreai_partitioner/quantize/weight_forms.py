"""How one weight is stored compressed, and the Core AI op that expands it.

A :class:`Form` is one way to store a weight, weight-only:

- ``int``: int8 or int4, symmetric, one scale per output channel or per block
  of ``size`` input channels; expanded by ``coreai::constexpr_blockwise_shift_scale``;
- ``lut`` (palettization): a look-up table of ``2 ** bits`` values per group of
  ``size`` output channels and an index per weight (:mod:`.kmeans`);
  expanded by ``coreai::lut_to_dense``.  With ``scaled`` each output channel
  is first divided by its largest magnitude (coremltools' and coreai-opt's
  per-channel scale), so one table serves rows of different scales, and
  ``coreai::constexpr_blockwise_shift_scale`` multiplies the scale back.

coreai-torch converts both ops to Core AI's constexpr ops, so the asset keeps
the compressed bytes (``si8``/``si4`` data, ``ui4``/``ui8`` indices) and the
device expands them.  int4 integers are held two a byte from the start
(:mod:`.packed_int4`), read through its ``unpack_int4`` op.  :func:`compress`
makes a weight's :class:`Compressed` buffers; :meth:`Compressed.build` is the
ops over its operands, for a module's ``forward`` or a graph's nodes.

A weight's axes: every dim before ``axis`` is a batch (an expert: its own
tables or scales), ``axis`` holds the output channels, the last dim the input
channels.  A Linear's ``[out, in]`` and an embedding's ``[vocab, width]``
have ``axis`` 0 (an embedding's rows are the tied lm_head's output channels).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner import _compat
from coreai_partitioner.quantize import packed_int4
from coreai_partitioner.quantize.kmeans import cluster_rows

#: The op that expands an int8/int4 weight with its scales on device.
DECOMPRESS_OP = "constexpr_blockwise_shift_scale"
#: The op that expands a palettized weight on device.
LUT_OP = "lut_to_dense"

__all__ = ["Compressed", "Form", "compress", "expand_tables", "expand_weights"]

#: Bits each form takes.
BITS = {"int": (4, 8), "lut": (4, 8)}
#: Elements of a weight an ``int`` form rounds at once: its float temporaries stay near 100 MB, whatever its size.
ROUNDED_AT_ONCE = 1 << 23


@dataclass(frozen=True)
class Form:
    """``kind`` ``"int"`` or ``"lut"``, ``bits``, and ``size``: input channels per scale (``int``; ``None`` is one
    scale per output channel) or output channels per look-up table (``lut``); ``scaled``: a ``lut`` over rows
    normalized by a scale per output channel."""

    kind: str
    bits: int
    size: int | None = None
    scaled: bool = False

    def __post_init__(self) -> None:
        if self.bits not in BITS.get(self.kind, ()):
            raise ValueError(f"no {self.bits}-bit {self.kind!r} form; forms: " + ", ".join(f"{k} {b}" for k, b in BITS.items()))
        if self.kind == "lut" and not self.size or self.size is not None and self.size < 1:
            raise ValueError(f"a {self.kind} form needs a positive size (got {self.size})")
        if self.scaled and self.kind != "lut":
            raise ValueError("only a look-up table form is scaled per output channel")

    @property
    def buffers(self) -> tuple[str, ...]:
        """The names of what the form stores, in the expanding ops' operand order."""
        if self.kind == "lut":
            return ("indices", "lut", "scale") if self.scaled else ("indices", "lut")
        return ("quantized", "scale")

    def __str__(self) -> str:
        if self.kind == "lut":
            scaled = ", over rows scaled per output channel" if self.scaled else ""
            return f"{self.bits}-bit look-up tables, one per {self.size} output channels{scaled}"
        return f"int{self.bits} per output channel" if self.size is None else f"int{self.bits} in blocks of {self.size} input channels"

    def misfit(self, shape: tuple[int, ...] | torch.Size, axis: int = 0, inputs: int | None = None) -> str | None:
        """Why a weight of ``shape`` cannot take this form, or ``None``.  ``inputs`` is the axis of its input
        channels, the one an int block runs along: ``axis + 1`` by default (a Linear's ``[out, in]``, a
        convolution's ``[out, in / groups, *kernel]``); a transposed convolution's ``[in, out / groups, *kernel]``
        has them at 0."""
        if len(shape) < axis + 2:
            return f"it has {len(shape)} dimension(s), and {self} needs output and input channels"
        if self.kind == "lut" and shape[axis] % self.size:
            return f"its {shape[axis]} output channels are not a multiple of {self.size}"
        channels = shape[axis + 1 if inputs is None else inputs]
        if self.kind == "int" and self.size is not None and channels % self.size:
            return f"its {channels} input channels are not a multiple of {self.size}"
        return None

    def stored_bits(self, shape: tuple[int, ...] | torch.Size, axis: int = 0, float_bits: int = 16) -> int:
        """Bits the asset stores for a weight of ``shape``: data or indices, and scales or tables in ``float_bits``."""
        numel = math.prod(shape)
        if self.kind == "lut":
            rows = math.prod(shape[: axis + 1])
            return numel * self.bits + rows // self.size * (1 << self.bits) * float_bits + self.scaled * rows * float_bits
        scales = numel // shape[-1] * (1 if self.size is None else shape[-1] // self.size)
        return numel * self.bits + scales * float_bits


@dataclass(frozen=True)
class Compressed:
    """A weight as ``form`` stores it: ``buffers`` in the expanding op's operand order; for a look-up table,
    ``error`` is its squared error relative to the weight's (``|W - W'|^2 / |W|^2``), when :func:`compress` was asked
    for it."""

    form: Form
    buffers: dict[str, torch.Tensor]
    error: float | None = None

    def build(self, call: Callable[[Any, tuple[Any, ...]], Any], operands: Mapping[str, Any] | None = None) -> Any:
        """The weight expanded from ``operands`` by buffer name (the buffers, or what stands for them in a graph)
        by the form's ops, each made by ``call(op, args)``: ``op(*args)`` computes it, a graph inserts a node."""
        ops = _compat.compression_ops()
        given = self.buffers if operands is None else operands
        operands = tuple(given[name] for name in self.form.buffers)  # the ops' operand order
        if self.form.kind == "int":
            data, scale = operands
            if packed_int4.is_packed(self.buffers["quantized"]):
                data = call(packed_int4.UNPACK_INT4, (data,))
            bits = torch.int4 if self.form.bits == 4 else torch.int8
            return call(ops.constexpr_blockwise_shift_scale.default, (data, scale, None, None, bits))
        dense = call(ops.lut_to_dense.default, (operands[0], operands[1], 0))
        if self.form.scaled:  # the table's values, times each output channel's scale
            dense = call(ops.constexpr_blockwise_shift_scale.default, (dense, operands[2]))
        return dense

    def expand(self) -> torch.Tensor:
        """The weight as the device sees it."""
        return self.build(lambda op, args: op(*args))

    def transpose(self, a: int, b: int) -> Compressed:
        """The same weight with dims ``a`` and ``b`` swapped (a table's leading dims follow the weight's)."""
        buffers = {}
        for name, tensor in self.buffers.items():
            if name == "quantized" and packed_int4.is_packed(tensor):  # its integers swapped, packed again if they can be
                tensor = packed_int4.unpack(tensor).transpose(a, b).contiguous()
                buffers[name] = packed_int4.pack(tensor) if packed_int4.packs(tensor.shape) else tensor
            else:
                buffers[name] = tensor.transpose(a, b).contiguous()
        return Compressed(self.form, buffers, self.error)


@torch.no_grad()
def compress(
    weight: torch.Tensor,
    form: Form,
    *,
    axis: int = 0,
    read: Callable[[int, int], torch.Tensor] | None = None,
    error: bool = False,
) -> Compressed:
    """``weight`` stored as ``form`` (see the module docstring for ``axis``); scales and tables in its dtype.
    ``read(start, stop)``, when given, reads rows of dim 0 of ``weight``, which then only gives their shape and
    dtype: an ``int`` form reads a few at a time (a weight streamed from its checkpoint, never held whole).
    ``error=True`` measures a table's squared error (:attr:`Compressed.error`, what ranks the weights a mixed scheme
    promotes); it costs a third of a scaled table's time, so it is measured only when asked.

    Raises ``ValueError`` for a shape the form does not fit (:meth:`Form.misfit`)
    or a weight that is not finite; callers check both first and name the layer.
    """
    reason = form.misfit(weight.shape, axis)
    if reason is not None:
        raise ValueError(f"a weight of shape {tuple(weight.shape)} cannot be stored as {form}: {reason}")
    if form.kind == "int":
        data, scale = _integers(weight, form, axis, read or (lambda start, stop: weight[start:stop]))
        return Compressed(form, {"quantized": data, "scale": scale})
    if read is not None:
        weight = read(0, weight.shape[0])
    shape = weight.shape
    rows = weight.reshape(math.prod(shape[: axis + 1]), -1)
    scale = None
    if not form.scaled:
        _check_finite(weight)
    else:
        # abs and max are exact in the weight's dtype, and the division promotes to float32: no float copy of the rows
        peak = rows.abs().amax(1, keepdim=True)
        _check_finite(peak)  # a row's maximum is NaN or infinite where any of its values is
        scale = peak.float().clamp(min=torch.finfo(torch.float16).tiny)
        scale = scale.to(weight.dtype).float()  # as stored, so the table fits the rows the device rebuilds
        rows = torch.div(rows, scale)
    indices, centroids, squared_error = cluster_rows(rows, form.bits, form.size)
    tables = [*shape[:axis], shape[axis] // form.size, *[1] * (len(shape) - axis - 1), 1 << form.bits, 1]
    buffers = {"indices": indices.view(shape), "lut": centroids.to(weight.dtype).view(tables)}
    if scale is not None:
        buffers["scale"] = scale.to(weight.dtype).view(*shape[: axis + 1], *[1] * (len(shape) - axis - 1))
        if error:  # of the rows as the device rebuilds them, scaled
            squared_error = _scaled_error(rows, scale, indices, centroids, form.size)
    return Compressed(form, buffers, squared_error if error else None)


def _check_finite(weight: torch.Tensor) -> None:
    if not bool(torch.isfinite(weight).all()):
        raise ValueError("the weight has NaN or infinite values, which no table or scale can hold")


def _scaled_error(rows: torch.Tensor, scale: torch.Tensor, indices: torch.Tensor, centroids: torch.Tensor, group: int) -> float:
    """``|W - W'|^2 / |W|^2`` of normalized ``rows`` [R, C] clustered as ``indices`` into ``centroids`` [R / group, k],
    each row times its ``scale`` [R, 1]; a group of rows at a time."""
    squared_error = squared = 0.0
    for start in range(0, rows.shape[0], group * 64):
        part = slice(start, start + group * 64)
        table = centroids[start // group : (start + rows[part].shape[0]) // group].float().repeat_interleave(group, 0)
        rebuilt = table.gather(1, indices[part].long())
        squared_error += float(((rebuilt - rows[part]) * scale[part]).square().sum())
        squared += float((rows[part] * scale[part]).square().sum())
    return squared_error / max(squared, 1e-30)


def _integers(
    weight: torch.Tensor, form: Form, axis: int, read: Callable[[int, int], torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data, scale)`` as coreai-opt's symmetric weight quantizer makes them, bit for bit: ``scale`` is a
    block's largest magnitude over half the integer range (``/ 127.5``, ``/ 7.5``) in the weight's dtype, the data
    ``round(weight / scale)`` in fp32, clamped to ``[-2 ** (bits - 1), 2 ** (bits - 1) - 1]``.  A block is every
    input channel (one scale per output channel) or ``size`` of them and whatever follows (a convolution's
    kernel); ``scale`` has the weight's rank.  ``data`` is int8, or int4 packed two a byte (:mod:`.packed_int4`)
    where the last dim is even.

    A few rows of dim 0 (an output channel or an expert, never input channels), ``read(start, stop)``, are
    rounded at a time, into the data made up front: an embedding's float temporaries would otherwise be several
    times its size."""
    packed = form.bits == 4 and packed_int4.packs(weight.shape)
    shape = (*weight.shape[:-1], weight.shape[-1] // 2) if packed else weight.shape
    data = torch.empty(shape, dtype=torch.uint8 if packed else torch.int8)
    rows = max(1, ROUNDED_AT_ONCE // max(1, math.prod(weight.shape[1:])))
    scales = []
    for start in range(0, weight.shape[0], rows):
        part = read(start, start + rows)
        _check_finite(part)
        part, scale = _rounded(part, form, axis)
        data[start : start + rows] = packed_int4.pack(part) if packed else part
        scales.append(scale)
    return data, torch.cat(scales)


def _rounded(weight: torch.Tensor, form: Form, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_integers` of a few rows: int8 data, scale."""
    low, high = -(1 << (form.bits - 1)), (1 << (form.bits - 1)) - 1
    inputs = axis + 1
    if form.size is None:
        amax = weight.abs().amax(dim=tuple(range(inputs, weight.dim())), keepdim=True)
        expand = lambda scale: scale  # noqa: E731 - broadcasts
    else:
        blocks = weight.unflatten(inputs, (weight.shape[inputs] // form.size, form.size))
        amax = blocks.abs().amax(dim=tuple(range(inputs + 1, blocks.dim())), keepdim=True).squeeze(inputs + 1)
        expand = lambda scale: scale.repeat_interleave(form.size, dim=inputs)  # noqa: E731
    scale = (amax / ((high - low) / 2)).clamp(min=torch.finfo(torch.float32).eps)
    data = torch.clamp(torch.round(weight.float() / expand(scale)), low, high).to(torch.int8)
    return data, scale


def expand_tables(indices: torch.Tensor, lut: torch.Tensor, axis: int = 0) -> torch.Tensor:
    """What ``coreai::lut_to_dense`` computes, by one gather for tables of scalars (``lut``'s last dim 1: every
    form here).  coreai-torch's own eager implementation repeats each table once per weight (a ``palettize8``
    weight 256 times over), which makes a palettized program's eager model slow to run and large in memory."""
    if lut.shape[-1] != 1:
        return _compat.compression_ops().lut_to_dense.default(indices, lut, axis)
    tables = lut[..., 0]  # [groups per dim of indices..., 2 ** bits]
    rank = indices.dim()
    groups = tuple(
        (torch.arange(size) // (size // tables.shape[dim])).reshape([size if d == dim else 1 for d in range(rank)])
        for dim, size in enumerate(indices.shape)
    )
    return tables[(*groups, indices.long())]


def expand_weights(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``module`` (a quantized program's eager model, ``program.module()``) with every compressed weight expanded
    once, in place: each ``lut_to_dense`` (by :func:`expand_tables`) and ``constexpr_blockwise_shift_scale`` call
    over the module's own constants is computed and stored as a buffer the graph reads, so a call runs as the
    float model's does instead of expanding every weight again.  Holds the expanded weights' memory."""
    ops = _compat.compression_ops()
    decompress = getattr(ops, DECOMPRESS_OP).default
    expanding = {
        getattr(ops, LUT_OP).default: expand_tables, expand_tables: expand_tables, decompress: decompress,
        packed_int4.UNPACK_INT4: packed_int4.unpack,
    }
    graph = module.graph
    values: dict[torch.fx.Node, torch.Tensor] = {}

    def constant(arg: Any) -> tuple[bool, Any]:
        if not isinstance(arg, torch.fx.Node):
            return True, arg
        if arg in values:
            return True, values[arg]
        if arg.op == "get_attr":
            value = module
            for part in arg.target.split("."):
                value = getattr(value, part)
            return True, value
        return False, None

    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in expanding:
            continue
        args = [constant(a) for a in node.args]
        kwargs = {k: constant(v) for k, v in node.kwargs.items()}
        if not all(ok for ok, _ in [*args, *kwargs.values()]):
            continue
        with torch.no_grad():
            value = expanding[node.target](*(v for _, v in args), **{k: v for k, (_, v) in kwargs.items()})
        source = next((a.target for a in node.all_input_nodes if a.op == "get_attr"), None)
        name = f"{source.replace('.', '_')}_expanded" if source else f"expanded_weight_{len(values)}"  # the weight's own name
        module.register_buffer(name, value)
        with graph.inserting_before(node):
            read = graph.get_attr(name)
        node.replace_all_uses_with(read)
        graph.erase_node(node)
        values[read] = value
    for read in [r for r in values if not r.users]:  # an expansion another one consumed: not kept
        graph.erase_node(read)
        delattr(module, read.target)
    if values:
        module.recompile()
    return module
