"""Rewrites of a delegate's own program before the converter sees it (:mod:`.convert` runs them).

:func:`order_state_writes` orders a stateful delegate's buffer writes as
Core AI orders its state: by input.

:func:`state_operands_as_values` passes a state to a composite as a value,
not as the state itself.

:func:`expand_repeated_heads` turns GQA's head repeat by ``index_select``
into an ``expand``, which coreai-core does not fold into a constant of K's
shape.

:func:`pool_arguments_in_full` writes a pool's omitted arguments out, as
coreai-torch reads them by position.

:func:`packed_int4_constants` hands the converter a packed int4 weight's
bytes as they are.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import GraphModule

from coreai_partitioner import _compat
from coreai_partitioner.records.call_sites import call_sites_by_op

def order_state_writes(program: ExportedProgram) -> bool:
    """Put ``program``'s buffer-mutation outputs in the order of their buffers' inputs; True if it moved any.

    Core AI state is one handle per mutated buffer, in input order, and the
    graph's output tokens must come in the same order ("order of token
    outputs does not match order of handle inputs", coreai-core 1.0.0b3).
    ``torch.export`` orders mutation outputs by when they happen, so a buffer
    registered before another but written after it breaks that.  Mutation
    outputs come first in the output node; user outputs keep their places.
    """
    signature = program.graph_signature
    inputs = [spec.target for spec in signature.input_specs if spec.kind == InputKind.BUFFER]
    output = program.graph.output_node()
    values = list(output.args[0])
    mutations = [i for i, spec in enumerate(signature.output_specs) if spec.kind == OutputKind.BUFFER_MUTATION]
    order = sorted(mutations, key=lambda i: inputs.index(signature.output_specs[i].target))
    if order == mutations:
        return False
    specs = list(signature.output_specs)
    for slot, source in zip(mutations, order):
        signature.output_specs[slot] = specs[source]
        values[slot] = output.args[0][source]
    output.args = (tuple(values),)
    program.graph_module.recompile()
    return True


def state_operands_as_values(program: ExportedProgram) -> int:
    """Feed each composite call site a state buffer through an ``add`` of 0; returns how many operands.

    coreai-core 1.0.0b3's pre-compilation rewrite fails on an odd number,
    3 or more, of composite calls that each read a state handle directly
    ("input types did not match callee signature ... for parametric op
    here"). Three Qwen3.5 gated delta-rule layers hit this, and so does a
    plain module with three ``GatedDeltaUpdate`` calls, each fed from its own
    mutated buffer. With the read made a value first, every count converts.
    The add costs one pass over the state per call.
    """
    signature = program.graph_signature
    states = set(signature.buffers_to_mutate.values())
    placeholders = {node for node in program.graph.nodes
                    if node.op == "placeholder" and signature.inputs_to_buffers.get(node.name) in states}
    graph, count = program.graph, 0
    for nodes in call_sites_by_op(graph).values():
        for site in nodes:
            for state in [arg for arg in site.args if arg in placeholders]:
                with graph.inserting_before(site):
                    value = graph.call_function(torch.ops.aten.add.Tensor, (state, 0))
                value.meta["val"] = state.meta["val"]
                site.replace_input_with(state, value)
                count += 1
    if count:
        program.graph_module.recompile()
    return count


def expand_repeated_heads(graph_module: GraphModule) -> int:
    """Turn ``index_select`` by a constant ``repeat_interleave`` index into ``expand`` + ``reshape``; returns how many.

    coreai-torch's SDPA composite repeats grouped-query K and V heads with
    ``index_select(x, 1, arange(n).repeat_interleave(r))``.  coreai-torch lowers
    that to a ``gather_along_axis`` over the index broadcast to ``x``'s shape,
    and coreai-core folds the broadcast into a constant of that shape: 32 kB
    of int32 in a tiny model's asset, 17 MB for a Qwen3-0.6B shape at context
    2048.  Unsqueezing, expanding and reshaping ``x`` repeats the same rows
    (HF's ``repeat_kv``) and stores nothing.  Only a statically shaped ``x``
    is rewritten: with a symbolic dim the broadcast is built at run time and
    never folded.
    """
    graph = graph_module.graph
    rewritten = 0
    for node in index_selects(graph):
        source, dim, index = node.args
        value = _val(source)
        if not isinstance(value, torch.Tensor) or not all(isinstance(size, int) for size in value.shape):
            continue
        dim = dim % value.dim()
        repeats = _repeat_interleave_count(_constant(index), value.shape[dim])
        if repeats is None:
            continue
        expanded_shape = [*value.shape[: dim + 1], repeats, *value.shape[dim + 1 :]]
        with graph.inserting_before(node):
            unsqueezed = graph.call_function(torch.ops.aten.unsqueeze.default, (source, dim + 1))
            expanded = graph.call_function(torch.ops.aten.expand.default, (unsqueezed, expanded_shape))
            # Row-major, whatever ``x``'s strides: a transposed ``x`` (a delta rule's heads) cloned as it is
            # could not be viewed as the repeated shape.
            copied = graph.call_function(
                torch.ops.aten.clone.default, (expanded,), {"memory_format": torch.contiguous_format}
            )
            reshaped = graph.call_function(torch.ops.aten.view.default, (copied, list(node.meta["val"].shape)))
        unsqueezed.meta["val"] = value.unsqueeze(dim + 1)
        expanded.meta["val"] = unsqueezed.meta["val"].expand(expanded_shape)
        copied.meta["val"] = expanded.meta["val"].clone(memory_format=torch.contiguous_format)
        reshaped.meta["val"] = copied.meta["val"].view(node.meta["val"].shape)
        if "stack_trace" in node.meta:  # coreai-torch parses a stack trace it finds, and cannot parse None
            for new in (unsqueezed, expanded, copied, reshaped):
                new.meta["stack_trace"] = node.meta["stack_trace"]
        node.replace_all_uses_with(reshaped)
        graph.erase_node(node)
        _erase_unused(index, graph)
        rewritten += 1
    if rewritten:
        graph_module.recompile()
    return rewritten


def index_selects(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The graph's ``index_select`` calls, ATen or edge; what :func:`expand_repeated_heads` looks at."""
    return [
        node
        for node in graph.nodes
        if node.op == "call_function" and _compat.aten_op(node.target) is torch.ops.aten.index_select.default
    ]


def _val(arg):
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None


def _constant(node) -> torch.Tensor | None:
    """The value of a node computed from literals alone (``arange(...).repeat_interleave(...)``), else None."""
    if not isinstance(node, torch.fx.Node):
        return node
    if node.op != "call_function" or not isinstance(node.target, _compat.OpOverload):
        return None
    if torch.Tag.nondeterministic_seeded in node.target.tags:  # randint: not the same value at run time
        return None
    inputs = {}
    for argument in node.all_input_nodes:
        inputs[argument] = _constant(argument)
        if inputs[argument] is None:
            return None
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), inputs.__getitem__)
    with _compat.unset_fake_temporarily():
        return node.target(*args, **kwargs)


def _repeat_interleave_count(index, size: int) -> int | None:
    """``r`` when ``index`` is ``arange(size).repeat_interleave(r)`` with ``r > 1``, else None."""
    if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.is_floating_point() or size <= 0:
        return None
    repeats, rest = divmod(index.numel(), size)
    if rest or repeats < 2:
        return None
    return repeats if torch.equal(index.cpu(), torch.arange(size).repeat_interleave(repeats).to(index.dtype)) else None


def _erase_unused(node, graph: torch.fx.Graph) -> None:
    """Erase ``node`` and then its inputs, as long as nothing else uses them."""
    pending = [node]
    while pending:
        current = pending.pop()
        if not isinstance(current, torch.fx.Node) or current.users or current.op != "call_function":
            continue
        inputs = current.all_input_nodes
        graph.erase_node(current)
        pending.extend(inputs)



#: pool op -> its arguments after the input, by name, with PyTorch's defaults (a stride of ``None`` or ``[]`` is the
#: kernel size: ``F.avg_pool2d(x, 2, ceil_mode=True)`` passes ``[]``)
_POOL_ARGUMENTS = {
    torch.ops.aten.avg_pool2d.default: (
        ("kernel_size", None), ("stride", None), ("padding", [0, 0]), ("ceil_mode", False), ("count_include_pad", True),
    ),
    torch.ops.aten.avg_pool3d.default: (
        ("kernel_size", None), ("stride", None), ("padding", [0, 0, 0]), ("ceil_mode", False), ("count_include_pad", True),
    ),
    torch.ops.aten.max_pool2d_with_indices.default: (
        ("kernel_size", None), ("stride", None), ("padding", [0, 0]), ("dilation", [1, 1]), ("ceil_mode", False),
    ),
}


def pool_arguments_in_full(graph_module: GraphModule) -> int:
    """Write each pool's arguments out by position, the stride as the kernel size when omitted; returns how many pools.

    coreai-torch reads them by position: it takes a stride of ``[]`` as the
    stride and dies on it (IndexError for ``avg_pool2d``, "rank 2 vs 4" for
    ``max_pool2d_with_indices``), and it reads ``count_include_pad`` whenever
    ``ceil_mode`` is given (IndexError when it is omitted).  ``divisor_override``
    stays as it is: the converter reads it only when present.
    """
    rewritten = 0
    for node in graph_module.graph.nodes:
        arguments = _POOL_ARGUMENTS.get(_compat.aten_op(node.target)) if node.op == "call_function" else None
        if arguments is None:
            continue
        args, kwargs = list(node.args), dict(node.kwargs)
        for index, (name, default) in enumerate(arguments, start=1):
            if index >= len(args):
                args.append(kwargs.pop(name, default))
        if not args[2]:
            args[2] = list(args[1])
        if tuple(args) != node.args or kwargs != node.kwargs:
            node.args, node.kwargs = tuple(args), kwargs
            rewritten += 1
    if rewritten:
        graph_module.recompile()
    return rewritten


#: The op a program reads packed int4 integers through (``coreai_partitioner.quantize.packed_int4`` defines it): its
#: schema name, what a node's target is called in an ATen or an edge program alike.
UNPACK_INT4 = "coreai_partitioner::unpack_int4"


def is_unpack_int4(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls ``unpack_int4``."""
    return node.op == "call_function" and getattr(node.target, "name", lambda: None)() == UNPACK_INT4


def packed_int4_constants(program: ExportedProgram) -> int:
    """Fold each ``unpack_int4`` of a weight into the weight itself; returns how many.  In place.

    The weight (uint8, two int4 values a byte) becomes coreai-torch's int4
    tensor over the same bytes (``_compat.int4_constant``), typed int4 in the
    graph, so coreai-torch embeds them as they are instead of packing a copy
    of an int8 tensor, which the program would hold at twice the size.
    ``program``'s state dict is its own (the caller's ``with_own_graph``
    copy): the entry is replaced, never the tensor changed.
    """
    targets = {spec.arg.name: spec.target for spec in program.graph_signature.input_specs if spec.target is not None}
    folded = 0
    for node in list(program.graph.nodes):
        if not is_unpack_int4(node):
            continue
        weight = node.args[0]
        target = targets.get(weight.name) if weight.op == "placeholder" else None
        table = program.state_dict if target in program.state_dict else program.constants
        if target not in table:
            raise ValueError(f"{node.name} unpacks {weight.name}, which is not a weight of the delegate's program")
        shape = node.meta["val"].shape
        table[target] = _compat.int4_constant(table[target], shape)
        weight.meta["val"] = torch.empty(shape, dtype=torch.int4, device="meta")
        node.replace_all_uses_with(weight)
        program.graph.erase_node(node)
        folded += 1
    if folded:
        program.graph_module.recompile()
    return folded
