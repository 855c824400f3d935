"""The ``int`` schemes through coreai-opt's graph-mode quantizer: its config, its run, and what it must leave.

coreai-opt re-exports the whole-model program, where every composite call
site is one opaque ``coreai_torch_ext::<op>`` node, and quantizes the Linear
and embedding weights outside the composites.  A configuration naming a
layer inside a composite, or a weight left unquantized, is an error naming
the layer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from coreai_partitioner.quantize import schemes
from coreai_partitioner.quantize.checks import check_call_sites
from coreai_partitioner.quantize.program_weights import Weight, is_composite, outside_composites, parameter_users
from coreai_partitioner.quantize.schemes import QuantizationError, Scheme
from coreai_partitioner.quantize.weight_forms import DECOMPRESS_OP
from coreai_partitioner.records.call_sites import externalized_op_name

logger = logging.getLogger(__name__)

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


def quantize_with_coreai_opt(
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


def _decompressed_weights(program: ExportedProgram) -> int:
    return sum(1 for n in program.graph.nodes if n.op == "call_function" and DECOMPRESS_OP in str(n.target))
