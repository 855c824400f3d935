"""Graph passes for Core AI lowering that also work with symbolic shapes.

Upstream's ``NarrowToCoreAIDtypesPass`` (ExecuTorch 1.5.1,
``backends/apple/coreai/passes/narrow_dtypes.py``) re-propagates dtypes with a
fresh ``FakeTensorProp``, whose new fake mode has no shape environment: on a
program exported with a dynamic dim (an LLM's token count ``T``) it fails on
the first symbolic ``expand_copy`` ("SymIntArrayRef expected to contain only
concrete integers").  :class:`NarrowToCoreAIDtypes` does the same narrowing and
re-propagates in the program's own fake mode, so the symbols stay the
program's.

:func:`remove_noop_expands` keeps an exported dim enumerable down to 1 (an
LLM's ``T`` in {1, chunk}): it drops the ``expand`` calls that specialize
wrongly in Core AI (coreai-core 1.0.0b3).

:class:`SplitSymbolicSizes` keeps a symbolic size off a delegate's boundary.

:func:`order_state_writes` orders a stateful delegate's buffer writes as
Core AI orders its state: by input.

:func:`state_operands_as_values` passes a state to a composite as a value,
not as the state itself.

:func:`expand_repeated_heads` turns GQA's head repeat by ``index_select``
into an ``expand``, which coreai-core does not fold into a constant of K's
shape.
"""

from __future__ import annotations


import torch
from executorch.exir.pass_base import PassResult
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import GraphModule
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from . import _compat

_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}


class NarrowToCoreAIDtypes:
    """Cast 64-bit graph inputs to 32 bits right after their placeholder, keep the I/O dtypes.

    Tensors the graph makes from scalars alone (``arange``, ``full``) are made
    32-bit too, so an attention mask built from positions stays inside the
    delegate (upstream leaves them 64-bit, outside it).  The interior (what the Core AI delegate sees) becomes 32-bit; 32-bit values
    feeding an originally 64-bit output are cast back.  The inserted casts
    keep a 64-bit operand, so op support leaves them outside the delegate.
    """

    def __call__(self, graph_module: GraphModule) -> PassResult:
        graph = graph_module.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        factories = [n for n in graph.nodes if _is_64bit_factory(n)]
        if not factories and not any(_is_64bit(p.meta.get("val")) for p in placeholders):
            return PassResult(graph_module, False)
        to_copy = _to_copy_for(graph)
        output = graph.output_node()
        output_dtypes = [_val(arg).dtype if _is_64bit(_val(arg)) else None for arg in output.args[0]]

        for placeholder in placeholders:
            val = placeholder.meta.get("val")
            if not _is_64bit(val):
                continue
            with graph.inserting_after(placeholder):
                cast = graph.call_function(to_copy, (placeholder,), {"dtype": _NARROW[val.dtype]})
            placeholder.replace_all_uses_with(cast)
            cast.args = (placeholder,)

        for factory in factories:
            factory.kwargs = {**factory.kwargs, "dtype": _NARROW[factory.meta["val"].dtype]}

        inputs = [p.meta["val"] for p in placeholders]
        fake_mode = _compat.detect_fake_mode(inputs)
        propagation = FakeTensorProp(graph_module, mode=fake_mode)
        if fake_mode is None:
            propagation.propagate(*inputs)
        else:
            propagation.propagate_dont_convert_inputs(*inputs)

        outputs = list(output.args[0])
        for index, dtype in enumerate(output_dtypes):
            arg = outputs[index]
            value = _val(arg)
            if dtype is None or not isinstance(value, torch.Tensor) or value.dtype == dtype:
                continue
            with graph.inserting_before(output):
                widen = graph.call_function(to_copy, (arg,), {"dtype": dtype})
            widen.meta["val"] = value.to(dtype)
            outputs[index] = widen
        output.args = (tuple(outputs),)
        graph_module.recompile()
        return PassResult(graph_module, True)


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
    from .call_sites import call_sites_by_op

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


class SplitSymbolicSizes:
    """Give every reader of a symbolic size its own ``sym_size``, so each goes where its reader goes.

    A ``sym_size`` read both by an op a Core AI delegate takes and by one it
    does not would be one node on the delegate's boundary, a symbolic scalar
    the delegate cannot return.  With one ``sym_size`` per reader, op support
    leaves out the ones whose reader stays outside (they read the size of a
    tensor outside too).
    """

    def __call__(self, graph_module: GraphModule) -> PassResult:
        graph = graph_module.graph
        modified = False
        for node in list(graph.nodes):
            if _compat.aten_op(node.target) is not torch.ops.aten.sym_size.int or len(node.users) < 2:
                continue
            for user in list(node.users)[1:]:
                with graph.inserting_after(node):
                    copy = graph.node_copy(node)
                user.replace_input_with(node, copy)
                modified = True
        if modified:
            graph_module.recompile()
        return PassResult(graph_module, modified)


def get_default_passes() -> list:
    """The edge transform passes Core AI lowering needs, for static and dynamic shapes alike."""
    return [SplitSymbolicSizes(), NarrowToCoreAIDtypes()]


def remove_noop_expands(graph_module: GraphModule) -> int:
    """Drop ``expand`` calls whose result has their input's shape; returns how many.

    ``torch.matmul``'s decomposition expands each operand to the shape it
    already has.  Converted, that is a ``coreai.broadcast_to`` to a shape read
    at run time, which coreai-core 1.0.0b3 folds to a value of another type
    when an enumerated shape makes a dim 1 ("incorrect fold result type", an
    abort).  The expand computes nothing, so it goes.
    """
    removed = 0
    for node in list(graph_module.graph.nodes):
        if node.op != "call_function" or _compat.aten_op(node.target) not in _EXPANDS:
            continue
        source = node.args[0]
        if _same_shape(_val(source), node.meta.get("val")):
            node.replace_all_uses_with(source)
            graph_module.graph.erase_node(node)
            removed += 1
    if removed:
        graph_module.recompile()
    return removed


_EXPANDS = (torch.ops.aten.expand.default, torch.ops.aten.expand_copy.default)


def _same_shape(a, b) -> bool:
    """Equal shapes, compared symbol by symbol (no guard on the shape environment)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dim() != b.dim():
        return False
    return all(_compat.sym_expr(x) == _compat.sym_expr(y) for x, y in zip(a.shape, b.shape))


def _to_copy_for(graph: torch.fx.Graph):
    if any(isinstance(n.target, _compat.EdgeOpOverload) for n in graph.nodes if n.op == "call_function"):
        return _compat.edge_ops.edge.aten._to_copy.default
    return torch.ops.aten._to_copy.default


def _val(arg):
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None


def _is_64bit_factory(node: torch.fx.Node) -> bool:
    """A node making a 64-bit tensor from scalars alone (``arange(0, L)``: HF's attention mask)."""
    if node.op != "call_function" or node.all_input_nodes or not _is_64bit(node.meta.get("val")):
        return False
    schema = _compat.op_schema(node.target)
    return schema is not None and any(argument.name == "dtype" for argument in schema.arguments)


def _is_64bit(val) -> bool:
    return isinstance(val, torch.Tensor) and val.dtype in _NARROW


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
        for new in (unsqueezed, expanded, copied, reshaped):
            new.meta["stack_trace"] = node.meta.get("stack_trace")
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
