"""Weight-only quantization between ``externalize_modules`` and lowering: coreai-opt's integers, or look-up tables.

Where it goes in the flow::

    ep, records = externalize_modules(model, default_specs(),
                                      export_fn=lambda m: torch.export.export(m, sample, dynamic_shapes=shapes))
    ep = quantize(ep, "int4-channel", records=records, dynamic_shapes=shapes)   # decomposes it too
    quantized_eager = ep.module()                   # the reference for verify, before lowering consumes ep
    lowered = to_edge_transform_and_lower(ep, partitioner=[CoreAIPartitioner(externalized_modules=records)], ...)

``scheme`` is a name of :data:`SCHEMES` (what each stores:
:mod:`coreai_partitioner.schemes`), a :class:`~.schemes.Scheme`, or a
coreai-opt ``QuantizerConfig``.  Every shape is checked against the scheme
first, and a weight it cannot store is an error naming its layer and the ways
out (``keep_float=[...]``, a smaller block or group) before any work.

The ``palettize*`` schemes are :func:`coreai_partitioner.palettize.palettize`'s
(k-means look-up tables; the program may be decomposed already).  The
``int`` schemes run coreai-opt (graph mode, built on PT2E), which re-exports
the whole-model program, where every composite call site is one opaque
``coreai_torch_ext::<op>`` node: it quantizes the Linear and embedding
weights outside the composites and never looks inside them, so the records'
own sub-exports (the composite bodies) stay float and keep pairing with
their call sites by op target.  Each quantized weight becomes an int8 or
int4 constant feeding ``coreai.constexpr_blockwise_shift_scale``, which
coreai-torch converts as such: the Core AI asset stores the weight
compressed and expands it on device, so the ``.pte`` is really smaller.
Embeddings (and a lm_head tied to one) are int8 per channel under every
``int`` scheme.

For the ``int`` schemes quantize *before* ``run_decompositions``: coreai-opt
finds Linear layers by their ``aten.linear`` pattern, which coreai-torch's
decomposition table turns into ``permute`` + ``mm``.  A weight that coreai-opt
cannot quantize is an error naming its layer (or pass the layer in
``keep_float``); so is a configuration that names a layer inside a composite.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram

from . import _compat, schemes
from .call_sites import call_sites_by_op, externalized_op_name, resolve_call_sites
from .program_weights import Weight, is_composite, is_kept, outside_composites, parameter_users
from .schemes import QuantizationError, Scheme

logger = logging.getLogger(__name__)

__all__ = [
    "SCHEMES",
    "QuantizationError",
    "QuantizedReport",
    "check",
    "check_model",
    "quantize",
    "quantizer_config",
    "uses_coreai_opt",
]

#: What each scheme name means (:data:`coreai_partitioner.schemes.SCHEMES` holds the schemes themselves).
SCHEMES = {name: str(s) for name, s in schemes.SCHEMES.items()}

#: The op that expands a compressed weight on device.
DECOMPRESS_OP = "constexpr_blockwise_shift_scale"
#: The op that expands a palettized weight on device.
LUT_OP = "lut_to_dense"


def uses_coreai_opt(scheme: str | Scheme | Any) -> bool:
    """Whether ``scheme`` runs coreai-opt's quantizer, which needs the program before ``run_decompositions``."""
    return not isinstance(scheme, (str, Scheme)) or not schemes.scheme(scheme).palettized


def quantizer_config(
    scheme: str | Scheme, *, block_size: int | None = None, keep_float: Sequence[str] = (), embeddings: Sequence[str] = ()
) -> Any:
    """The coreai-opt ``QuantizerConfig`` of an ``int`` ``scheme`` (see :data:`SCHEMES`).

    ``embeddings`` names the modules that read an embedding table (the
    embedding, and a lm_head tied to it), which get the scheme's embedding
    form; ``keep_float`` names modules (paths in the exported program) to
    leave in floating point.
    """
    from coreai_opt.quantization import ModuleQuantizerConfig, QuantizerConfig

    found = schemes.scheme(scheme, block_size=block_size)
    if found.palettized:
        raise ValueError(f"{found.name} is a palettization scheme, not a coreai-opt QuantizerConfig; quantize() takes it")
    config = _preset(QuantizerConfig.presets, found.linear)
    names = dict.fromkeys(embeddings, _preset(ModuleQuantizerConfig.presets, found.embedding))
    names.update(dict.fromkeys(keep_float, None))
    if names:
        config.module_name_configs = {**(config.module_name_configs or {}), **names}
    return config


def _preset(presets: Any, form: Any) -> Any:
    if form.bits == 8:
        return presets.w8()
    return presets.w4() if form.size is None else presets.w4_per_block(block_size=form.size)


def quantize(
    exported_program: ExportedProgram,
    scheme: str | Scheme | Any = "int8",
    *,
    records: Sequence[Any] | None = None,
    example_inputs: tuple[Any, ...] | None = None,
    dynamic_shapes: Any = None,
    keep_float: Sequence[str] = (),
    block_size: int | None = None,
    group_size: int | None = None,
    decompositions: Mapping[Any, Callable[..., Any]] | None = None,
) -> ExportedProgram:
    """Quantize the weights of ``exported_program`` outside its composites; return a program to lower.

    ``exported_program`` is what ``externalize_modules`` returned, not yet run
    through ``run_decompositions`` (a ``palettize*`` scheme takes it either
    way).  ``scheme`` is a name of :data:`SCHEMES`, a :class:`~.schemes.Scheme`
    or a coreai-opt ``QuantizerConfig`` (graph mode; name modules by their
    path in the program, never a module type); ``block_size`` and
    ``group_size`` resize its int4 blocks or look-up table groups.
    ``records`` (the ones ``externalize_modules`` returned) are checked to
    still pair with the quantized program's call sites.  ``example_inputs``
    default to the program's own; a program exported with dynamic dimensions
    needs the same ``dynamic_shapes`` again (coreai-opt and the final export
    re-export it).  ``keep_float`` names layers to leave in floating point
    (module paths, or parameter names); any other weight the scheme cannot
    store is an error.

    The result is decomposed with ``decompositions`` (coreai-torch's table by
    default), ready for ``to_edge_transform_and_lower``; its ``module()`` is
    the quantized eager model.  The input program is left as it was.
    """
    if decompositions is None:
        from coreai_torch import get_decomp_table

        decompositions = get_decomp_table()
    if isinstance(scheme, (str, Scheme)):
        scheme = schemes.scheme(scheme, group_size=group_size, block_size=block_size)
        if scheme.palettized:
            from .palettize import palettize

            palettized = palettize(exported_program, scheme, records=records, keep_float=keep_float)
            return _decomposed(palettized, decompositions)
        _check_int_shapes(exported_program, scheme, keep_float)
    return _quantize_with_coreai_opt(
        exported_program, scheme, records, example_inputs, dynamic_shapes, keep_float, decompositions
    )


def _decomposed(program: ExportedProgram, decompositions: Mapping[Any, Callable[..., Any]]) -> ExportedProgram:
    """``program`` decomposed with ``decompositions``, unless no op of the table is left in it."""
    from executorch.exir.graph_module import contains_any_call_fn_target_op

    if contains_any_call_fn_target_op(program.graph_module, list(decompositions)):
        with torch.no_grad():
            return program.run_decompositions(decompositions)
    return program


def _quantize_with_coreai_opt(
    exported_program: ExportedProgram,
    scheme: Scheme | Any,
    records: Sequence[Any] | None,
    example_inputs: tuple[Any, ...] | None,
    dynamic_shapes: Any,
    keep_float: Sequence[str],
    decompositions: Mapping[Any, Callable[..., Any]],
) -> ExportedProgram:
    from coreai_opt.common import ExportBackend
    from coreai_opt.quantization import Quantizer

    if example_inputs is None:
        if exported_program.example_inputs is None:
            raise ValueError("the program carries no example inputs; pass example_inputs=(...)")
        args, kwargs = exported_program.example_inputs
        if kwargs:
            raise ValueError("the program was exported with keyword inputs; pass example_inputs=(...) positionally")
        example_inputs = tuple(args)
    if dynamic_shapes is None and _has_symbolic_inputs(exported_program):
        raise ValueError(
            "the program has dynamic input dimensions; pass the dynamic_shapes it was exported with "
            "(quantize re-exports it, and would otherwise make every dimension static)"
        )

    model = exported_program.module()
    modules = {name for name, _ in model.named_modules()}
    float_modules = [name for name in keep_float if name in modules]  # the rest name parameters
    weights = outside_composites(exported_program)
    if isinstance(scheme, Scheme):
        embeddings = [layer for layer in _embedding_readers(exported_program, weights) if layer in modules]
        config = quantizer_config(scheme, keep_float=float_modules, embeddings=embeddings)
    else:
        config = scheme
    if config.execution_mode.value != "graph":
        raise QuantizationError("quantize needs a graph-mode QuantizerConfig (ExecutionMode.GRAPH)")
    _check_config(config, model, exported_program)

    # coreai-opt runs the model once to set up its observers, writing any KV cache in place (the
    # model's own buffers, shared with the program): every buffer starts over from its value now.
    initial = {name: buffer.clone() for name, buffer in model.named_buffers()}
    quantizer = Quantizer(model, config)
    try:
        quantizer.prepare(example_inputs, dynamic_shapes=dynamic_shapes)
        finalized = quantizer.finalize(backend=ExportBackend.CoreAI)
    except ValueError as error:
        if "no fake quantization nodes" not in str(error):
            raise
        _raise_unquantized([w for w in weights.values() if not w.is_kept(keep_float)], error)
    with torch.no_grad():
        for name, buffer in [*model.named_buffers(), *finalized.named_buffers()]:
            if name in initial:
                buffer.copy_(initial[name])
    with torch.no_grad():
        quantized = torch.export.export(finalized, example_inputs, dynamic_shapes=dynamic_shapes).run_decompositions(decompositions)

    _check_weights_quantized(quantized, weights, keep_float)
    check_call_sites(exported_program, quantized, records)
    logger.info("quantized %d weight(s) (%s)", _decompressed_weights(quantized), getattr(scheme, "name", "custom config"))
    return quantized


def check_model(
    model: torch.nn.Module,
    scheme: str | Scheme,
    *,
    keep_float: Sequence[str] = (),
    planned: Sequence[schemes.Planned] = (),
) -> None:
    """Before any export: raise naming every weight of ``model`` the scheme cannot store, and the ways out.

    The weights are those of its Linear, convolution and embedding modules,
    those a module storing its own says it stores (``module.planned(scheme,
    path)``, a list of :class:`~.schemes.Planned`: MoE experts), and
    ``planned``.  Works on a meta-device model (shapes only).  A Linear whose
    weight is an embedding's (a tied lm_head) takes the embedding's form.
    """
    found = schemes.scheme(scheme)
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    names: dict[int, list[str]] = {}
    tensors = {}
    weights = list(planned)
    for layer, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, _STORED) and isinstance(weight, torch.Tensor):
            names.setdefault(id(weight), []).append(layer)
            tensors[id(weight)] = weight
        elif callable(getattr(module, "planned", None)) and not is_kept(layer, layer, keep_float):
            weights += module.planned(found, layer)
    for key, layers in names.items():
        if any(is_kept(f"{layer}.weight", layer, keep_float) for layer in layers):
            continue
        form = found.embedding if key in embedded else found.linear
        weights.append(schemes.Planned(f"{layers[0]}.weight", layers[0], tuple(tensors[key].shape), form))
    schemes.check_fits(weights, found.name)


#: Modules whose weight every scheme stores.
_STORED = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d)


# ---------------------------------------------------------------- checks


def _has_symbolic_inputs(exported_program: ExportedProgram) -> bool:
    for node in exported_program.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape):
            return True
    return False


def _embedding_readers(exported_program: ExportedProgram, weights: dict[str, Weight]) -> list[str]:
    """Module paths of every op reading an embedding table (the embedding, and a lm_head tied to it)."""
    users = parameter_users(exported_program)
    layers = []
    for name, weight in weights.items():
        if weight.is_embedding:
            layers += [_module_path(node) for alias in (name, *weight.aliases) for node in users[alias] if not is_composite(node)]
    return sorted({layer for layer in layers if layer})


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else ""


def _check_int_shapes(exported_program: ExportedProgram, scheme: Scheme, keep_float: Sequence[str]) -> None:
    """Every weight coreai-opt will quantize fits the scheme's form (int4 blocks divide its input channels)."""
    planned = [
        schemes.Planned(w.name, w.layer, w.shape, scheme.embedding if w.is_embedding else scheme.linear)
        for w in outside_composites(exported_program).values()
        if not w.is_kept(keep_float)
    ]
    schemes.check_fits(planned, scheme.name)


def _composite_of(node: torch.fx.Node) -> str:
    op_name = externalized_op_name(node.target)
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack.values()))[0] if stack else op_name
    return f"'{path}' ({externalized_op_name(node.target)})"


def _check_config(config: Any, model: torch.nn.Module, exported_program: ExportedProgram) -> None:
    """A configuration naming a layer inside a composite, a type, or nothing at all is an error."""
    if config.module_type_configs:
        raise QuantizationError(
            f"module_type_configs ({', '.join(map(str, config.module_type_configs))}) cannot apply to an "
            "exported program: its modules no longer have their types. Name the layers in "
            "module_name_configs, or set op_type_config (e.g. 'linear') in global_config."
        )
    names = [name for name, _ in model.named_modules() if name]
    users = parameter_users(exported_program, min_dim=1)
    for key, module_config in (config.module_name_configs or {}).items():
        pattern = re.compile(re.escape(key) if key in names else key)
        matched = [name for name in names if pattern.fullmatch(name)]
        if not matched:
            raise QuantizationError(
                f"the quantization config names layer {key!r}, which is not in the exported program. "
                "Name layers by their module path in the program (e.g. 'model.layers.0.mlp.down_proj')."
            )
        if module_config is None:  # leaving a layer float is always possible
            continue
        for name in matched:
            params = {p: nodes for p, nodes in users.items() if p.startswith(name + ".")}
            readers = [n for nodes in params.values() for n in nodes]
            if readers and all(is_composite(n) for n in readers):
                raise QuantizationError(
                    f"the quantization config asks for layer {name!r}, which is inside the composite "
                    f"{_composite_of(readers[0])}: coreai-opt cannot quantize inside a composite body. "
                    "Remove it from module_name_configs, or leave the module out of externalize_modules' specs."
                )


def _check_weights_quantized(quantized: ExportedProgram, weights: dict[str, Weight], keep_float: Sequence[str]) -> None:
    """Every weight that was outside the composites is now read through a decompression op."""
    still_float = parameter_users(quantized)
    _raise_unquantized([
        w for name, w in weights.items()
        if any(not is_composite(n) for alias in (name, *w.aliases) for n in still_float.get(alias, ())) and not w.is_kept(keep_float)
    ])


def _raise_unquantized(missed: list[Weight], cause: Exception | None = None) -> None:
    if not missed:
        if cause is not None:
            raise QuantizationError("nothing to quantize: every weight outside the composites is in keep_float") from cause
        return
    listed = "; ".join(f"{w.name} (read by {', '.join(w.ops)})" for w in missed)
    raise QuantizationError(
        f"coreai-opt left {len(missed)} weight(s) unquantized: {listed}. It quantizes Linear, "
        "Conv and Embedding layers exported as aten.linear / aten.conv / aten.embedding "
        "(quantize before run_decompositions, which turns linear into mm), and skips "
        "layers whose shape does not fit the scheme (int4 needs input channels divisible by the "
        f"block size). Pass keep_float=[{', '.join(repr(w.layer or w.name) for w in missed)}] to keep them float, "
        "or use a palettize scheme, which stores any weight."
    ) from cause


def check_call_sites(before: ExportedProgram, after: ExportedProgram, records: Sequence[Any] | None) -> None:
    """Quantization kept every composite call site, and the records still pair with them."""
    counts_before = {op: len(n) for op, n in call_sites_by_op(before.graph).items()}
    counts_after = {op: len(n) for op, n in call_sites_by_op(after.graph).items()}
    if counts_before != counts_after:
        changed = sorted(op for op in counts_before.keys() | counts_after.keys() if counts_before.get(op) != counts_after.get(op))
        raise QuantizationError(f"quantization changed the composite call sites of {', '.join(changed)}")
    if records is None:
        return
    resolution = resolve_call_sites(records, [after.graph, *(r.exported_program.graph for r in records)])
    if resolution.mismatches:
        raise QuantizationError("; ".join(str(m) for m in resolution.mismatches))


def _decompressed_weights(program: ExportedProgram) -> int:
    return sum(1 for n in program.graph.nodes if n.op == "call_function" and DECOMPRESS_OP in str(n.target))


# ---------------------------------------------------------------- verify


@dataclass(frozen=True)
class QuantizedReport:
    """A quantized program against the quantized eager model (pass/fail) and the float one (what it cost)."""

    against_quantized: Any  # verify.Report
    against_float: Any  # verify.Report

    @property
    def ok(self) -> bool:
        return self.against_quantized.ok

    def __str__(self) -> str:
        costs = "\n".join(
            f"  output {o.index}: max abs error {o.max_abs_error:.3e}, max rel error {o.max_rel_error:.3e}"
            for o in self.against_float.outputs
        )
        return (
            f"against the quantized eager model:\n{self.against_quantized}\n\n"
            f"cost of quantization (against the float model; information, not a check):\n{costs}"
        )

    def raise_for_mismatch(self) -> None:
        """Raise with both tables when the program does not match the quantized eager model."""
        if not self.ok:
            raise AssertionError("quantized program does not match the quantized eager model:\n" + str(self))


def check(
    program: Any,
    quantized_reference: Callable[..., Any] | Sequence[torch.Tensor] | torch.Tensor,
    float_reference: Callable[..., Any] | Sequence[torch.Tensor] | torch.Tensor,
    *inputs: Any,
    rtol: float | None = None,
    atol: float | None = None,
    method: str = "forward",
) -> QuantizedReport:
    """Run ``program`` once (see ``verify.run``) and compare it with both references.

    ``quantized_reference`` is the quantized eager model (``quantize(...).module()``)
    or its outputs; the program must match it within tolerance.
    ``float_reference`` is the float model or its outputs; that error is
    reported, not judged.
    """
    from . import verify

    actual = verify.run(program, *inputs, method=method)
    expected = [_outputs(reference, inputs) for reference in (quantized_reference, float_reference)]
    return QuantizedReport(
        verify.compare(actual, expected[0], rtol, atol),
        verify.compare(actual, expected[1], rtol, atol),
    )


def _outputs(reference: Any, inputs: tuple) -> tuple[torch.Tensor, ...]:
    if callable(reference):
        with torch.no_grad():
            reference = reference(*inputs)
    if isinstance(reference, torch.Tensor):
        return (reference,)
    return tuple(_compat.tree_flatten(reference)[0])
