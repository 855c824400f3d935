"""The edge passes Core AI lowering needs, for static and dynamic shapes alike: :func:`get_default_passes`.

Upstream's ``NarrowToCoreAIDtypesPass`` (ExecuTorch 1.5.1,
``backends/apple/coreai/passes/narrow_dtypes.py``) re-propagates dtypes with a
fresh ``FakeTensorProp``, whose new fake mode has no shape environment: on a
program exported with a dynamic dim (an LLM's token count ``T``) it fails on
the first symbolic ``expand_copy`` ("SymIntArrayRef expected to contain only
concrete integers").  :class:`NarrowToCoreAIDtypes` does the same narrowing and
re-propagates in the program's own fake mode, so the symbols stay the
program's.

:class:`SplitSymbolicSizes` keeps a symbolic size off a delegate's boundary.
:class:`RemoveNoopAsStrided` drops the ``as_strided_copy`` that restrides a
tensor to its own layout (``adaptive_avg_pool2d(x, 1)`` in the heads of
convnext and swin), which coreai-torch does not convert.
:class:`BatchOneBmmAsMm` turns a ``bmm`` whose second operand is a batch-1
tensor expanded over the batch into one ``mm``, which coreai-core's rewrite
pipeline mis-ranks (VITS's relative-position attention).
:class:`FloatOperands` casts an integer operand of a floating-point function
(``torch.rsqrt(torch.tensor(2))`` in Kokoro's residual blocks) to the result's
dtype, which the converter otherwise keeps integer ("dtype si32 vs f32").
:func:`remove_noop_expands`, run on an exported program before lowering,
keeps a dimension enumerable down to 1 (an LLM's ``T`` in {1, chunk}): it
drops the ``expand`` calls that specialize wrongly in Core AI (coreai-core 1.0.0b3).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from executorch.exir.pass_base import PassResult
from torch.fx import GraphModule

from coreai_partitioner import _compat

_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}


class NarrowToCoreAIDtypes:
    """Cast 64-bit graph inputs to 32 bits right after their placeholder, keep the I/O dtypes.

    Tensors the graph makes from scalars alone (``arange``, ``full``) are made
    32-bit too, so an attention mask built from positions stays inside the
    delegate (upstream leaves them 64-bit, outside it).  The interior (what the Core AI delegate sees) becomes 32-bit; 32-bit values
    feeding an originally 64-bit output are cast back.  The inserted casts
    keep a 64-bit operand, so op support leaves them outside the delegate,
    except a constant's (a parameter, buffer or lifted constant the delegate
    takes over with its data).  A placeholder nothing reads (BatchNorm's
    ``num_batches_tracked`` in eval) gets no cast.
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

        narrowed = []
        for placeholder in placeholders:
            val = placeholder.meta.get("val")
            if not _is_64bit(val) or not placeholder.users:
                continue
            with graph.inserting_after(placeholder):
                cast = graph.call_function(to_copy, (placeholder,), {"dtype": _NARROW[val.dtype]})
            placeholder.replace_all_uses_with(cast)
            cast.args = (placeholder,)
            narrowed.append(cast)

        for factory in factories:
            factory.kwargs = {**factory.kwargs, "dtype": _NARROW[factory.meta["val"].dtype]}

        propagate_from(graph_module, [*narrowed, *factories], to_copy)

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


#: ATen's elementwise functions that compute in floating point: an integer operand's result is floating.
FLOAT_FUNCTIONS = (
    "rsqrt", "sqrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sigmoid", "reciprocal", "erf", "erfinv",
)


class FloatOperands:
    """Cast the integer (or bool) operand of a floating-point function to its result's dtype, before the function.

    ATen promotes it inside the kernel; coreai-torch lowers the function on the
    operand's dtype and fails the program ("aten_rsqrt_default[0]: dtype si32
    vs f32"), so ``torch.rsqrt(torch.tensor(2))`` killed a whole lowering.  The
    cast is what ATen does first, so the numbers are the same.
    """

    def __call__(self, graph_module: GraphModule) -> PassResult:
        graph = graph_module.graph
        op = _op_for(graph)
        functions = {op(name) for name in FLOAT_FUNCTIONS}
        to_copy = _to_copy_for(graph)
        changed = False
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in functions:
                continue
            operand, result = node.args[0], _val(node)
            value = _val(operand)
            if not (isinstance(value, torch.Tensor) and isinstance(result, torch.Tensor)):
                continue
            if value.dtype.is_floating_point or not result.dtype.is_floating_point:
                continue
            with graph.inserting_before(node):
                cast = graph.call_function(to_copy, (operand,), {"dtype": result.dtype})
            cast.meta["val"] = value.to(result.dtype)
            node.replace_input_with(operand, cast)
            changed = True
        if changed:
            graph_module.recompile()
        return PassResult(graph_module, changed)


def propagate_from(graph_module: GraphModule, changed: list[torch.fx.Node], to_copy) -> None:
    """Re-propagate ``meta["val"]`` from the ``changed`` nodes to the nodes they reach, in the program's fake mode.

    Only what a changed dtype or layout reaches runs again, so the program's
    symbols stay its own: a full ``FakeTensorProp`` makes fresh ones for every
    data-dependent size (``nonzero``, ``item()``) and then guards on them
    ("Could not extract specialized integer from data-dependent expression
    u7", VITS).  A node whose value comes out as it was stops the spread; a
    node that cannot run again on its new operands (a guard on such a size)
    gets them cast back to what they were, with ``to_copy``.
    """
    graph = graph_module.graph
    inputs = [node.meta.get("val") for node in graph.nodes if node.op == "placeholder"]
    fake_mode = _compat.detect_fake_mode(inputs)
    shape_env = fake_mode.shape_env if fake_mode is not None else None
    old = {node: node.meta.get("val") for node in graph.nodes}
    seeds, changed = set(changed), set()
    with fake_mode or contextlib.nullcontext():
        for node in list(graph.nodes):
            if node.op != "call_function" or (node not in seeds and not any(i in changed for i in node.all_input_nodes)):
                continue
            try:
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
                new = node.target(*args, **kwargs)
            except Exception:  # noqa: BLE001 - a guard on a data-dependent size: this node keeps what it read
                for operand in [i for i in node.all_input_nodes if i in changed and _dtype(old[i]) != _dtype(_val(i))]:
                    with graph.inserting_before(node):
                        widen = graph.call_function(to_copy, (operand,), {"dtype": old[operand].dtype})
                    widen.meta["val"] = old[operand]
                    node.replace_input_with(operand, widen)
                continue
            finally:
                if shape_env is not None:
                    shape_env.pending_fresh_unbacked_symbols.clear()
            if _layout(new) != _layout(old[node]):
                node.meta["val"] = new
                changed.add(node)
    graph_module.recompile()


def _dtype(value):
    return value.dtype if isinstance(value, torch.Tensor) else None


def _layout(value):
    """What a reader of ``value`` depends on beyond its sizes: its dtypes and strides."""
    parts = value if isinstance(value, (tuple, list)) else (value,)
    return tuple(
        (part.dtype, tuple(map(str, map(_compat.sym_expr, part.stride())))) if isinstance(part, torch.Tensor) else type(part)
        for part in parts
    )


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


class RemoveNoopAsStrided:
    """Drop each ``as_strided_copy`` whose result is its input: same shape, no offset, and the strides of a dense
    tensor of that shape wherever a dim has more than one element.

    Decomposing ``adaptive_avg_pool2d(x, 1)`` restrides its ``(N, C, 1, 1)`` result to channels-last strides
    (``[C, 1, C, C]``); an ExecuTorch tensor is dense, so reading it at those strides reads it whole, in order.
    The converter has no lowering for ``as_strided``: kept, it is a node outside that splits the model in two
    delegates.
    """

    def __call__(self, graph_module: GraphModule) -> PassResult:
        removed = False
        for node in list(graph_module.graph.nodes):
            if node.op == "call_function" and _compat.aten_op(node.target) is torch.ops.aten.as_strided_copy.default:
                if _restrides_in_place(node):
                    node.replace_all_uses_with(node.args[0])
                    graph_module.graph.erase_node(node)
                    removed = True
        if removed:
            graph_module.recompile()
        return PassResult(graph_module, removed)


def _restrides_in_place(node: torch.fx.Node) -> bool:
    source, size, stride = node.args[0], node.args[1], node.args[2]
    offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
    shape = _val(source).shape if isinstance(_val(source), torch.Tensor) else None
    if offset not in (None, 0) or shape is None or not all(isinstance(d, int) for d in (*size, *stride, *shape)):
        return False
    if list(shape) != list(size):
        return False
    dense = 1
    for dim, step in zip(reversed(size), reversed(stride)):
        if dim > 1 and step != dense:
            return False
        dense *= dim
    return True


class BatchOneBmmAsMm:
    """``bmm(a, expand(w))`` with ``w`` of batch 1 becomes ``view(mm(view(a, [B*M, K]), w[0]), [B, M, N])``.

    ``torch.matmul`` of a ``[B, M, K]`` tensor and a ``[1, K, N]`` one
    decomposes to a ``bmm`` over ``w`` expanded to ``[B, K, N]``.  Converted,
    that is a ``broadcast_in_dims`` into a batch matmul, which coreai-core
    1.0.0b3's pre-compilation rewrite can fold into a rank-4 value it then
    refuses ("'coreai.broadcast_in_dims' op failed to verify that Result 0 and
    operand 0 must have the same rank": VITS's relative-position attention,
    whose query is a view of a rank-4 tensor).  One ``mm`` over the batch's rows
    computes the same products with no broadcast.  At most one of ``B`` and
    ``M`` may be symbolic (it becomes the view's ``-1``); otherwise the ``bmm``
    stays.
    """

    def __call__(self, graph_module: GraphModule) -> PassResult:
        graph = graph_module.graph
        changed = False
        for node in list(graph.nodes):
            if node.op != "call_function" or _compat.aten_op(node.target) is not torch.ops.aten.bmm.default:
                continue
            a, expanded = node.args[0], node.args[1]
            weight = _batch_one_source(expanded)
            rows = _rows_view(_val(a), _val(node))
            if weight is None or rows is None:
                continue
            batch, m, k = _val(a).shape
            n = _val(node).shape[2]
            op = _op_for(graph)
            with graph.inserting_before(node):
                flat = graph.call_function(op("view_copy"), (a, [rows, k]))
                flat.meta["val"] = _val(a).reshape(rows, k)
                matrix = graph.call_function(op("view_copy"), (weight, [k, n]))
                matrix.meta["val"] = _val(weight).reshape(k, n)
                product = graph.call_function(op("mm"), (flat, matrix))
                product.meta["val"] = torch.mm(flat.meta["val"], matrix.meta["val"])
                shaped = graph.call_function(op("view_copy"), (product, _view_back(batch, m, n)))
                shaped.meta["val"] = _val(node)
            node.replace_all_uses_with(shaped)
            graph.erase_node(node)
            changed = True
        if changed:
            graph.eliminate_dead_code()
            graph_module.recompile()
        return PassResult(graph_module, changed)


def _batch_one_source(node: Any) -> torch.fx.Node | None:
    """The ``[1, K, N]`` tensor ``node`` expands over the batch, through views that keep its shape; else None."""
    while isinstance(node, torch.fx.Node) and _compat.aten_op(node.target) in _VIEWS:
        if not _same_shape(_val(node.args[0]), _val(node)):
            return None
        node = node.args[0]
    if not isinstance(node, torch.fx.Node) or _compat.aten_op(node.target) not in _EXPANDS:
        return None
    source = node.args[0]
    shape = _val(source).shape if isinstance(_val(source), torch.Tensor) else None
    if shape is None or len(shape) != 3 or not isinstance(shape[0], int) or shape[0] != 1:
        return None
    return source if all(isinstance(d, int) for d in shape[1:]) else None


_VIEWS = (torch.ops.aten.view.default, torch.ops.aten.view_copy.default, torch.ops.aten._unsafe_view.default)


def _rows_view(a, result) -> Any:
    """The row count of ``a`` (``[B, M, K]``) flattened, ``-1`` where one of ``B``, ``M`` is symbolic; None if both."""
    if not isinstance(a, torch.Tensor) or not isinstance(result, torch.Tensor) or not isinstance(a.shape[2], int):
        return None
    symbolic = [d for d in a.shape[:2] if not isinstance(d, int)]
    if len(symbolic) > 1:
        return None
    return -1 if symbolic else a.shape[0] * a.shape[1]


def _view_back(batch: Any, m: Any, n: int) -> list:
    return [batch if isinstance(batch, int) else -1, m if isinstance(m, int) else -1, n]


def _op_for(graph: torch.fx.Graph):
    """``name`` as the graph's dialect spells it: an edge op in an edge program, else ATen's."""
    namespace = _compat.edge_ops.edge.aten if _is_edge(graph) else torch.ops.aten
    return lambda name: getattr(namespace, name).default


def get_default_compile_config() -> Any:
    """Core AI's ``EdgeCompileConfig``: upstream's (``_skip_dim_order``), with ExecuTorch's opset check off.

    The check refuses every ATen op outside the Core ATen opset before the
    partitioner sees the program, whoever would run it: ``round(decimals=)``,
    which the converter lowers.  What the converter does not lower is left to the portable
    kernels, and an op neither runs is decomposed first
    (:mod:`coreai_partitioner.partition.kernel_gaps`), so the check has nothing
    left to say; XNNPACK's config and ExecuTorch's test harness turn it off too.
    """
    return _compat.without_opset_check(_compat.upstream_compile_config())


def get_default_passes() -> list:
    """The edge transform passes Core AI lowering needs, for static and dynamic shapes alike."""
    return [SplitSymbolicSizes(), RemoveNoopAsStrided(), BatchOneBmmAsMm(), FloatOperands(), NarrowToCoreAIDtypes()]


def _to_copy_for(graph: torch.fx.Graph):
    return _compat.edge_ops.edge.aten._to_copy.default if _is_edge(graph) else torch.ops.aten._to_copy.default


def _is_edge(graph: torch.fx.Graph) -> bool:
    """Whether ``graph`` is in the edge dialect (its ops edge ops), so that an op it gains must be one too."""
    return any(isinstance(n.target, _compat.EdgeOpOverload) for n in graph.nodes if n.op == "call_function")


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


