"""Weight-only quantization with coreai-opt, between ``externalize_modules`` and lowering.

Where it goes in the flow::

    ep, records = externalize_modules(model, default_specs(),
                                      export_fn=lambda m: torch.export.export(m, sample, dynamic_shapes=shapes))
    ep = quantize(ep, "int8", records=records, dynamic_shapes=shapes)   # or "int4"; decomposes it too
    quantized_eager = ep.module()                   # the reference for verify, before lowering consumes ep
    lowered = to_edge_transform_and_lower(ep, partitioner=[CoreAIPartitioner(externalized_modules=records)], ...)

coreai-opt (graph mode, built on PT2E) re-exports the whole-model program,
where every composite call site is one opaque ``coreai_torch_ext::<op>``
node: it quantizes the Linear and embedding weights outside the composites and
never looks inside them, so the records' own sub-exports (the composite bodies)
stay float and keep pairing with their call sites by op target.  Each quantized
weight becomes an int8 or int4 constant feeding ``coreai.constexpr_blockwise_shift_scale``,
which coreai-torch converts as such: the Core AI asset stores the weight
compressed and expands it on device, so the ``.pte`` is really smaller.

Quantize *before* ``run_decompositions``: coreai-opt finds Linear layers by
their ``aten.linear`` pattern, which coreai-torch's decomposition table turns
into ``permute`` + ``mm``.  A weight that coreai-opt cannot quantize is an error
naming its layer (or pass the layer in ``keep_float``); so is a configuration
that names a layer inside a composite.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram

from .call_sites import call_sites_by_op, externalized_op_name, resolve_call_sites
from . import _compat

logger = logging.getLogger(__name__)

__all__ = ["SCHEMES", "QuantizationError", "QuantizedReport", "check", "quantize", "quantizer_config"]

#: What each scheme name means.
SCHEMES = {
    "int8": "int8 weights, per output channel, symmetric, weight-only",
    "int4": "int4 weights, blocks of 32 along the input channels, symmetric, weight-only",
}

#: The op that expands a compressed weight on device.
DECOMPRESS_OP = "constexpr_blockwise_shift_scale"


class QuantizationError(ValueError):
    """A layer coreai-opt cannot quantize, or a configuration it cannot apply; the message names it."""


def quantizer_config(scheme: str, *, block_size: int = 32, keep_float: Sequence[str] = ()) -> Any:
    """The coreai-opt ``QuantizerConfig`` of ``scheme`` (see :data:`SCHEMES`).

    ``keep_float`` names modules (paths in the exported program) to leave in
    floating point.
    """
    from coreai_opt.quantization import QuantizerConfig

    if scheme == "int8":
        config = QuantizerConfig.presets.w8()
    elif scheme == "int4":
        config = QuantizerConfig.presets.w4_per_block(block_size=block_size)
    else:
        raise ValueError(
            f"no quantization scheme named {scheme!r}; choose one of {', '.join(SCHEMES)}, "
            "or pass a coreai_opt.quantization.QuantizerConfig"
        )
    if keep_float:
        config.module_name_configs = {**(config.module_name_configs or {}), **{name: None for name in keep_float}}
    return config


def quantize(
    exported_program: ExportedProgram,
    scheme: str | Any = "int8",
    *,
    records: Sequence[Any] | None = None,
    example_inputs: tuple[Any, ...] | None = None,
    dynamic_shapes: Any = None,
    keep_float: Sequence[str] = (),
    block_size: int = 32,
    decompositions: Mapping[Any, Callable[..., Any]] | None = None,
) -> ExportedProgram:
    """Quantize the weights of ``exported_program`` outside its composites; return a program to lower.

    ``exported_program`` is what ``externalize_modules`` returned, not yet run
    through ``run_decompositions``.  ``scheme`` is ``"int8"`` (per channel),
    ``"int4"`` (blocks of ``block_size``) or a coreai-opt ``QuantizerConfig``
    (graph mode; name modules by their path in the program, never a module
    type).  ``records`` (the ones ``externalize_modules`` returned) are checked
    to still pair with the quantized program's call sites.  ``example_inputs``
    default to the program's own; a program exported with dynamic
    dimensions needs the same ``dynamic_shapes`` again (coreai-opt and the
    final export re-export it).  ``keep_float`` names layers to leave in
    floating point (module paths, or parameter names); any other weight
    coreai-opt cannot quantize is an error.

    The result is decomposed with ``decompositions`` (coreai-torch's table by
    default), ready for ``to_edge_transform_and_lower``; its ``module()`` is
    the quantized eager model.  The input program is left as it was.
    """
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
    if decompositions is None:
        from coreai_torch import get_decomp_table

        decompositions = get_decomp_table()

    model = exported_program.module()
    modules = {name for name, _ in model.named_modules()}
    float_modules = [name for name in keep_float if name in modules]  # the rest name parameters
    config = scheme if not isinstance(scheme, str) else quantizer_config(scheme, block_size=block_size, keep_float=float_modules)
    if config.execution_mode.value != "graph":
        raise QuantizationError("quantize needs a graph-mode QuantizerConfig (ExecutionMode.GRAPH)")
    weights = _weights_outside_composites(exported_program)
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
        _raise_unquantized([w for w in weights.values() if not _kept(w, keep_float)], error)
    with torch.no_grad():
        for name, buffer in [*model.named_buffers(), *finalized.named_buffers()]:
            if name in initial:
                buffer.copy_(initial[name])
    with torch.no_grad():
        quantized = torch.export.export(finalized, example_inputs, dynamic_shapes=dynamic_shapes).run_decompositions(decompositions)

    _check_weights_quantized(quantized, weights, keep_float)
    _check_call_sites(exported_program, quantized, records)
    logger.info("quantized %d weight(s) (%s)", _decompressed_weights(quantized), scheme if isinstance(scheme, str) else "custom config")
    return quantized


# ---------------------------------------------------------------- checks


def _has_symbolic_inputs(exported_program: ExportedProgram) -> bool:
    for node in exported_program.graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape):
            return True
    return False


@dataclass(frozen=True)
class _Weight:
    name: str  # parameter FQN
    layer: str  # the module holding it
    ops: tuple[str, ...]  # what consumes it outside composites


def _op_label(node: torch.fx.Node) -> str:
    return getattr(node.target, "__name__", str(node.target))


def _is_composite(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and externalized_op_name(node.target) is not None


def _parameter_users(exported_program: ExportedProgram, min_dim: int = 2) -> dict[str, list[torch.fx.Node]]:
    """``{parameter FQN: the nodes reading it}`` for every floating parameter of ``min_dim``+ dims."""
    placeholders = {node.name: node for node in exported_program.graph.nodes if node.op == "placeholder"}
    users = {}
    for spec in exported_program.graph_signature.input_specs:
        if spec.kind != torch.export.graph_signature.InputKind.PARAMETER:
            continue
        value = exported_program.state_dict.get(spec.target)
        if value is None or not value.is_floating_point() or value.dim() < min_dim or value.numel() == 0:
            continue
        users[spec.target] = list(placeholders[spec.arg.name].users)
    return users


def _weights_outside_composites(exported_program: ExportedProgram) -> dict[str, _Weight]:
    """Floating weights some op outside a composite reads: what quantization is for."""
    weights = {}
    for name, nodes in _parameter_users(exported_program).items():
        outside = tuple(sorted({_op_label(n) for n in nodes if not _is_composite(n)}))
        if outside:
            weights[name] = _Weight(name, name.rpartition(".")[0], outside)
    return weights


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
    users = _parameter_users(exported_program, min_dim=1)
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
            if params and all(_is_composite(n) for n in readers):
                raise QuantizationError(
                    f"the quantization config asks for layer {name!r}, which is inside the composite "
                    f"{_composite_of(readers[0])}: coreai-opt cannot quantize inside a composite body. "
                    "Remove it from module_name_configs, or leave the module out of externalize_modules' specs."
                )


def _kept(weight: _Weight, keep_float: Sequence[str]) -> bool:
    return any(k in (weight.name, weight.layer) or weight.layer.startswith(k + ".") for k in keep_float)


def _check_weights_quantized(quantized: ExportedProgram, weights: dict[str, _Weight], keep_float: Sequence[str]) -> None:
    """Every weight that was outside the composites is now read through a decompression op."""
    still_float = _parameter_users(quantized)
    _raise_unquantized([
        w for name, w in weights.items()
        if any(not _is_composite(n) for n in still_float.get(name, ())) and not _kept(w, keep_float)
    ])


def _raise_unquantized(missed: list[_Weight], cause: Exception | None = None) -> None:
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
        f"block size). Pass keep_float=[{', '.join(repr(w.layer or w.name) for w in missed)}] to keep them float."
    ) from cause


def _check_call_sites(before: ExportedProgram, after: ExportedProgram, records: Sequence[Any] | None) -> None:
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
