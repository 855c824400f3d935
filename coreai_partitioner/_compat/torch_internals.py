"""torch's private names: symbolic sizes and their ranges, exporting to decomposed ATen in one trace, programs rebuilt
over other graphs, module internals, fake tensors; and transformers' two (T5's position buckets, the weights a model
keeps in fp32), diffusers' one (its configs' class field)."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch._guards import detect_fake_mode
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._pytree import tree_flatten

#: The field of every diffusers config file (``model_index.json``, ``scheduler_config.json``) naming its class.
DIFFUSERS_CLASS = "_class_name"


def annotate_nodes(annotation: dict) -> Any:
    """``torch.fx.traceback.annotate``: ops traced inside get ``annotation`` in ``node.meta["custom"]``
    (kept only by a trace under :func:`preserve_node_meta`)."""
    from torch.fx.traceback import annotate

    return annotate(annotation)


def preserve_node_meta() -> Any:
    """``torch.fx.traceback.preserve_node_meta``: a trace keeps the annotations of :func:`annotate_nodes`."""
    from torch.fx.traceback import preserve_node_meta as preserve

    return preserve()


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` for the block and is restored after it.  Not thread-safe."""
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


def stack_traces_recorded(recorded: bool) -> Any:
    """Traces inside record each node's Python stack (``node.meta["stack_trace"]``) or not: torch's
    ``torch.fx.config.do_not_emit_stack_traces``, set for the block and restored after."""
    import torch.fx

    return _replaced(torch.fx.config, "do_not_emit_stack_traces", not recorded)


@contextlib.contextmanager
def composite_ops_listed_once() -> Iterator[None]:
    """torch's list of the CompositeImplicitAutograd ops ``torch.export`` can keep, made once for the block.

    ``ExportedProgram.run_decompositions`` asks for it two or three times
    (``_collect_all_valid_cia_ops``, in ``torch.export.decomp_utils`` and
    ``torch.export.exported_program``), and each time torch walks every
    operator namespace: about a third of a small sub-export's time.  The list
    changes only when an op is registered, so the block must register none.
    Not thread-safe: the two modules' function is swapped for the block.
    """
    from torch._export import utils
    from torch.export import decomp_utils, exported_program

    once = functools.cache(utils._collect_all_valid_cia_ops)
    with _replaced(decomp_utils, "_collect_all_valid_cia_ops", once):
        with _replaced(exported_program, "_collect_all_valid_cia_ops", once):
            yield


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
    values = [node.meta.get("val") for node in program.graph.nodes if node.op == "placeholder"]
    return detect_fake_mode([value for value in values if isinstance(value, torch.Tensor)]) or fake_mode()


def graph_signature_with_inputs(signature: Any, input_specs: list) -> Any:
    """``signature`` with ``input_specs`` in place of its own (``ExportGraphSignature`` is a dataclass)."""
    import dataclasses

    return dataclasses.replace(signature, input_specs=list(input_specs))


#: :func:`rebuilt`'s default for a part: the program's own.
_OWN: Any = object()


def rebuilt(
    program: Any,
    *,
    root: Any = _OWN,
    graph: Any = _OWN,
    signature: Any = _OWN,
    state_dict: Any = _OWN,
    range_constraints: Any = _OWN,
    module_call_graph: Any = _OWN,
    example_inputs: Any = _OWN,
    constants: Any = _OWN,
    verifiers: Any = _OWN,
) -> Any:
    """An ``ExportedProgram`` made anew from ``program``'s parts, each given one in place of its own (``root`` a graph
    module; ``graph`` by default the root's).  Every program this package rebuilds is made here: the constructor's
    keywords and what it validates change between torch releases."""
    from torch.export import ExportedProgram

    def own(part: Any, default: Any) -> Any:
        return default if part is _OWN else part

    root = own(root, program.graph_module)
    return ExportedProgram(
        root=root,
        graph=own(graph, root.graph),
        graph_signature=own(signature, program.graph_signature),
        state_dict=own(state_dict, program.state_dict),
        range_constraints=own(range_constraints, program.range_constraints),
        module_call_graph=own(module_call_graph, program.module_call_graph),
        example_inputs=own(example_inputs, program.example_inputs),
        constants=own(constants, program.constants),
        verifiers=own(verifiers, program.verifiers),
    )


def exported_program_like(program: Any, graph_module: Any, signature: Any, constants: dict) -> Any:
    """An ``ExportedProgram`` of ``program``'s kind (dialect, verifiers) over another graph, signature and constants.

    Range constraints keep only the symbols the new graph's placeholders still have.
    """
    symbols = set()
    for node in graph_module.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor):
            for size in value.shape:
                if isinstance(size, torch.SymInt):
                    symbols |= size.node.expr.free_symbols
    return rebuilt(
        program,
        root=graph_module,
        signature=signature,
        range_constraints={key: value for key, value in program.range_constraints.items() if key in symbols},
        example_inputs=None,
        constants=constants,
        verifiers=list(program.verifiers),
    )


def program_with_constants(program: Any, constants: dict) -> Any:
    """A shallow copy of ``program`` whose constants are the dict ``constants`` (not :func:`rebuilt`: the constructor
    validates a signature a caller's pass may have left stale)."""
    import copy

    own = copy.copy(program)
    own._constants = constants
    return own


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
    module: torch.nn.Module, args: tuple, dynamic_shapes: Any, decompositions: dict, kwargs: dict | None = None
) -> torch.export.ExportedProgram:
    """``torch.export.export(...).run_decompositions(decompositions)`` in one trace instead of two.

    torch 2.13's ``torch.export._trace._export(pre_dispatch=False)`` traces to
    functional ATen IR through ``_export_to_aten_ir``, whose ``decomp_table``
    ``run_decompositions`` fills on its own re-trace; here the first trace
    applies it.  A CompositeImplicitAutograd op decomposes as the trace meets it; one the table leaves out is kept,
    as ``run_decompositions`` keeps it (``upsample_nearest2d.vec``, which the trace would otherwise decompose to an
    ``index``), by overriding those few ops alone for the trace (overriding all of them, as ``run_decompositions``
    does, costs a third of a second a trace).  Not thread-safe: the module's function is swapped for the call.
    """
    import functools

    from torch.export import _trace, exported_program

    kept = {op: exported_program._special_op_to_preserve_cia for op in _composite_ops() if op not in decompositions}
    to_aten = functools.partial(_trace._export_to_aten_ir, decomp_table=decompositions)
    with _replaced(_trace, "_export_to_aten_ir", to_aten), exported_program._override_composite_implicit_decomp(kept):
        return _trace._export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False, pre_dispatch=False)


def core_aten_table() -> dict:
    """``torch.export.default_decompositions()`` as the dict ``run_decompositions()`` applies."""
    return torch.export.default_decompositions().materialize()


@functools.cache
def _composite_ops() -> frozenset:
    """The CompositeImplicitAutograd ops ``torch.export`` can keep (every functional one): the same every call."""
    from torch.export import exported_program

    return frozenset(exported_program._collect_all_valid_cia_ops())


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


def op_schema(target: Any) -> Any:
    """The ``FunctionSchema`` of an op overload (ATen or edge), or None for a target that has none."""
    return getattr(target, "_schema", None)


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


def t5_relative_position_bucket(attention: Any, relative: torch.Tensor, *, bidirectional: bool) -> torch.Tensor:
    """The bucket of each of ``relative`` (key position less query position) by transformers' T5
    (``T5Attention._relative_position_bucket``), with ``attention``'s bucket count and longest distance."""
    return type(attention)._relative_position_bucket(
        relative,
        bidirectional=bidirectional,
        num_buckets=attention.relative_attention_num_buckets,
        max_distance=attention.relative_attention_max_distance,
    )



def fake_tensor(shape: Any, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` without data (a fake tensor, which ``torch.export`` traces as a real one)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        return torch.empty(shape, dtype=dtype)


def is_fake_tensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a fake tensor (a shape and dtype, no data)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


def kept_in_fp32(model: Any, dtype: torch.dtype) -> Any:
    """Whether ``from_pretrained(dtype=dtype)`` keeps a parameter of ``model`` (by name) in fp32: transformers'
    ``_keep_in_fp32_modules`` (at fp16) and ``_keep_in_fp32_modules_strict`` (at fp16 and bf16), searched in the
    name as its loader searches them (``PreTrainedModel._get_dtype_plan``, ``build_glob_alternation``)."""
    from transformers.core_model_loading import build_glob_alternation

    plan = model._get_dtype_plan(dtype)
    if not plan:
        return lambda name: False
    pattern, groups, _ = build_glob_alternation(list(plan))
    return lambda name: (found := pattern.search(name)) is not None and plan[groups[found.lastgroup]] == torch.float32


# ---------------------------------------------------------------- torch's node names (lowering/repeated.py)

#: torch.fx's node names: a base, then ``_<number>`` from the second node of that base on.
FX_NODE_NAME = re.compile(r"^([a-zA-Z_][0-9a-zA-Z_]*?)(?:_(\d+))?$")


def fx_name_parts(name: str) -> tuple[str, int] | None:
    """A torch.fx node name's base and number (``add_3``: ``("add", 3)``; ``add``: ``("add", 0)``), or ``None``."""
    match = FX_NODE_NAME.match(name)
    return None if match is None else (match.group(1), int(match.group(2) or 0))


def fx_name(base: str, number: int) -> str:
    """The name torch.fx gives the ``number``-th node (from 0) of ``base``."""
    return f"{base}_{number}" if number else base


def layer_placeholder_name(name: str, path: str, old: int, new: int) -> str | None:
    """torch.export's placeholder name for a tensor of module ``<path>.<old>`` (``p_layers_3_mlp_up_weight``: its
    target's path, dots made underscores) for the same tensor of ``<path>.<new>``; ``None`` where it names no
    ``<path>.<old>``."""
    before, after = f"_{path.replace('.', '_')}_{old}_", f"_{path.replace('.', '_')}_{new}_"
    return name.replace(before, after, 1) if before in name else None


def layer_call_site_name(name: str, path: str, old: int, new: int) -> str | None:
    """torch.export's name for a call-site node of module ``<path>.<old>`` (its module's path, dots made underscores,
    then the export's suffix) for the same call site of ``<path>.<new>``; ``None`` where it is not named so."""
    flat = path.replace(".", "_")
    renamed, found = re.subn(rf"^{re.escape(flat)}_{old}_", f"{flat}_{new}_", name)
    return renamed if found else None
