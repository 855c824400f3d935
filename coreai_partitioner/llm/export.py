"""One ``.pte`` for ExecuTorch's LLM runner: shapes, export, lowering, runner metadata.

:func:`lower_decoder` makes the program an on-device LLM ships, in the form
ExecuTorch's LLM runner (``extension/llm/runner``) reads: one ``forward(tokens
[1, T], input_pos [T]) -> logits`` over static caches held as Core AI delegate
state, ``T`` from 1 to a prefill chunk (a whole prompt in one call, or one
token), embedding, decoder and lm_head in one delegate, and the runner's
metadata methods (:func:`runner_metadata`).  :class:`DecoderShapes` picks
dynamic ``T`` or enumerated ``T`` in {1, chunk}.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from coreai_partitioner import _compat
from coreai_partitioner.llm.blocks import Recurrent
from coreai_partitioner.llm.decoder import Decoder, state_buffers

logger = logging.getLogger(__name__)

#: Shape modes of the host form's ``forward``: ``T`` any of 1..chunk, or only 1 and chunk.
SHAPE_MODES = ("dynamic", "enumerated")

#: What a lowered decoder is for: this package's host runtime (caches as delegate state, any shape mode), or
#: upstream's on-device Core AI runtime (:mod:`.device`: static shapes, caches owned by ExecuTorch).
TARGETS = ("host", "device")

#: How the device form lays out its shapes: one bounded-dynamic ``forward`` (T in 1..chunk), or two static
#: methods (``forward`` T = 1, ``prefill`` T = chunk).
DEVICE_SHAPES = ("bounded", "static")


@dataclass(frozen=True)
class DecoderShapes:
    """The limits a lowered decoder was built for.

    ``max_context_len`` is the cache length (prompt plus generated tokens);
    ``prefill_chunk`` the most tokens one ``forward`` call takes.  ``mode``
    ``"dynamic"`` exports ``T`` as a dimension from 1 to ``prefill_chunk``
    (GPU and CPU targets, and any prompt length in one call); ``"enumerated"``
    compiles one Core AI asset with an entrypoint for ``T = 1`` and one for
    ``T = prefill_chunk`` sharing the weights (static shapes; a shorter prompt
    is padded in front to the chunk).  Both are the host form's.

    ``target="device"`` is the form upstream's on-device runtime runs
    (:mod:`.device`), laid out by ``device_shapes``: ``"bounded"`` (default)
    is one method ``forward`` whose ``T`` runs from 1 to ``prefill_chunk``, a
    bounded-dynamic dimension (ExecuTorch's ``TextLLMRunner`` prefills a
    prompt in chunks of ``prefill_chunk``); ``"static"`` is a method ``forward``
    of ``T = 1`` and a method ``prefill`` of ``T = prefill_chunk``, for a
    runner that wants fixed shapes (a prompt in whole chunks, the rest one
    token a call).
    """

    max_context_len: int = 128
    prefill_chunk: int = 32
    mode: str = "dynamic"
    target: str = "host"
    device_shapes: str = "bounded"

    def __post_init__(self) -> None:
        if self.mode not in SHAPE_MODES:
            raise ValueError(f"shape mode {self.mode!r}: choose one of {', '.join(SHAPE_MODES)}")
        if self.target not in TARGETS:
            raise ValueError(f"target {self.target!r}: choose one of {', '.join(TARGETS)}")
        if self.device_shapes not in DEVICE_SHAPES:
            raise ValueError(f"device shapes {self.device_shapes!r}: choose one of {', '.join(DEVICE_SHAPES)}")
        if self.target == "device" and self.mode == "enumerated":
            raise ValueError(
                "the device form lays out its own shapes (device_shapes: bounded, forward T = 1..prefill_chunk; or "
                "static, forward T = 1 and prefill T = prefill_chunk); leave the shape mode at its default"
            )
        if not 1 <= self.prefill_chunk <= self.max_context_len:
            raise ValueError(
                f"prefill_chunk {self.prefill_chunk} must be between 1 and max_context_len "
                f"{self.max_context_len}"
            )
        if self.mode == "enumerated" and self.prefill_chunk == 1:
            raise ValueError("enumerated shapes need prefill_chunk > 1 (T = 1 and T = prefill_chunk)")

    @property
    def device(self) -> bool:
        return self.target == "device"

    @property
    def bounded(self) -> bool:
        """Whether the device form's ``forward`` takes any ``T`` up to the chunk (else ``T = 1``, beside ``prefill``)."""
        return self.device and self.device_shapes == "bounded"

    def methods(self) -> dict[str, int | None]:
        """The device form's methods and their static ``T`` (``None``: bounded, 1 to the chunk).

        Bounded: ``forward`` alone.  Static: ``forward`` 1 and ``prefill`` the chunk (when above 1).
        """
        if self.device_shapes == "bounded":
            return {"forward": None}
        methods: dict[str, int | None] = {"forward": 1}
        if self.prefill_chunk > 1:
            methods["prefill"] = self.prefill_chunk
        return methods

    def input_enumerations(self) -> list[dict[int, list[int]]] | None:
        """``CoreAIPartitioner(input_enumerations=...)`` for this mode: T of tokens and input_pos."""
        if self.mode != "enumerated":
            return None
        values = [1, self.prefill_chunk]
        return [{1: values}, {0: values}]


class UnsupportedShapes(ValueError):
    """Shapes a model cannot be exported with; names the model type, the reason and the shapes it takes."""


def adapt(model: nn.Module, shapes: DecoderShapes, *, full_logits: bool = False) -> Decoder:
    """The :class:`~.decoder.Decoder` of ``model``'s family, over its own weights, for ``shapes``.

    Raises :class:`~.families.UnsupportedModel` for a model no family adapts,
    :class:`~.errors.UnsupportedConfig` for a config value its family cannot
    honour and :class:`UnsupportedShapes` for shapes it cannot take
    (recurrent layers and enumerated shapes), all before any export work.
    """
    from coreai_partitioner.llm.adapter import Build
    from coreai_partitioner.llm.families import family_of

    family = family_of(model)
    config = model.config.get_text_config()
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and shapes.max_context_len > limit:
        raise Build(model, shapes.max_context_len).refuse(
            "max_position_embeddings", limit, f"a context of at most {limit} positions (got max_context_len {shapes.max_context_len})"
        )
    build = Build(model, shapes.max_context_len, full_logits=full_logits)
    decoder = family.build(build).eval()
    recurrent = [type(m).__name__ for m in decoder.modules() if isinstance(m, Recurrent)]
    if recurrent and shapes.mode == "enumerated":
        raise UnsupportedShapes(
            f"{build.model_type}: enumerated shapes pad a short prompt in front, and its recurrent layers "
            f"({', '.join(sorted(set(recurrent)))}) would take the padding into their state; export with dynamic "
            "shapes (--shapes dynamic)"
        )
    logger.info("%s: %d layer(s) adapted by %s", build.model_type, len(decoder.layers), family.__name__.rsplit(".", 1)[-1])
    return decoder


def export_decoder(
    model: nn.Module,
    shapes: DecoderShapes,
    *,
    full_logits: bool = False,
    quantize: Any = None,
    keep_float: Sequence[str] = (),
    decompositions: dict | None = None,
    decoder: Decoder | None = None,
    length: int | None = None,
    layers_per_delegate: int | None = None,
):
    """Externalize the composites of ``model``'s :class:`~.decoder.Decoder` and export it with ``T`` symbolic.

    In the device form (``shapes.target``) it is the :class:`~.device.DeviceDecoder`
    that is exported, its boundary annotations kept, a graph break every
    ``layers_per_delegate`` layers.  ``length`` exports ``T = length`` static
    (the device form's static layout); without it ``T`` runs from 1 to the chunk.

    Returns ``(exported_program, records)`` as :func:`~coreai_partitioner.lowering.lower.export_with_composites`
    does (``decompositions`` traces straight to decomposed ATen IR with that table).  ``quantize`` (a scheme of
    :data:`coreai_partitioner.quantize.schemes.SCHEMES`) stores the weights outside the composites compressed
    (:func:`coreai_partitioner.quantize.quantize`), and the experts of MoE layers the same way
    (:meth:`~.blocks.MoE.quantize_experts`); routers stay float, and so do the layers ``keep_float``
    names.  Every shape is checked against the scheme before any work.
    """
    from coreai_partitioner.lowering.lower import export_with_composites

    decoder = decoder if decoder is not None else adapt(model, shapes, full_logits=full_logits)
    exported: nn.Module = decoder
    if shapes.device:
        from coreai_partitioner.llm.device import DeviceDecoder

        exported = DeviceDecoder(decoder, layers_per_delegate)
    dynamic_shapes = None
    if length is None:
        length = min(2, shapes.prefill_chunk)
        if shapes.prefill_chunk > 1:
            tokens_dim = torch.export.Dim("T", min=1, max=shapes.prefill_chunk)
            dynamic_shapes = ({1: tokens_dim}, {0: tokens_dim})
    sample = (torch.zeros(1, length, dtype=torch.long), torch.arange(length))

    routers = []
    if quantize:  # the experts feed gather_mm, so they are compressed here; quantize() stores the rest
        from coreai_partitioner.quantize.program_weights import is_kept
        from coreai_partitioner.quantize import check_model
        from coreai_partitioner.llm.blocks import MoE

        experts = {p: m for p, m in decoder.named_modules() if isinstance(m, MoE) and not is_kept(p, p, keep_float)}
        check_model(decoder, quantize, keep_float=keep_float)
        for path, module in experts.items():
            if not module.forms:  # the device form exports the decoder once per method
                module.quantize_experts(quantize, path)
            routers.append(f"{path}.router")  # routing stays float: quantized logits would pick other experts
    # The program names the decoder's weights from the exported module: the device form's wraps it.
    prefix = "" if exported is decoder else "decoder."
    return export_with_composites(
        exported, sample, dynamic_shapes=dynamic_shapes, quantize=quantize or None,
        keep_float=[prefix + path for path in (*keep_float, *routers)], decompositions=decompositions,
        annotations=shapes.device,
    )


def runner_metadata(model: nn.Module, shapes: DecoderShapes) -> dict[str, Any]:
    """The constant methods ExecuTorch's LLM runner reads (``extension/llm/runner/constants.h``).

    ``get_max_seq_len`` (required by the runner) is the most tokens one call
    takes, ``get_max_context_len`` the cache length.  ``enable_dynamic_shape``
    makes the runner prefill a prompt in calls of up to ``get_max_seq_len``
    tokens; without it (enumerated shapes, the device form's static layout)
    it feeds the prompt one token at a time (T = 1 is always there).
    """
    config = model.config.get_text_config()
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None) or getattr(config, "eos_token_id", None)
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    bos = getattr(generation, "bos_token_id", None) or getattr(config, "bos_token_id", None)
    return {
        "get_max_seq_len": shapes.prefill_chunk,
        "get_max_context_len": shapes.max_context_len,
        "get_vocab_size": config.vocab_size,
        "get_bos_id": bos if bos is not None else 0,
        "get_eos_ids": eos_ids,
        "use_kv_cache": True,
        "enable_dynamic_shape": shapes.bounded if shapes.device else shapes.mode == "dynamic",
    }


def lower_decoder(
    model: nn.Module,
    shapes: DecoderShapes,
    *,
    full_logits: bool = False,
    quantize: Any = None,
    keep_float: Sequence[str] = (),
    quantized_reference: list | None = None,
    decoder: Decoder | None = None,
    target: str | None = None,
    graph_breaks: int | None = None,
    **partitioner_options: Any,
):
    """Export and lower ``model`` to one ``forward`` method in one Core AI delegate, with runner metadata.

    ``forward`` returns the last position's logits (``[1, 1, vocab]``), or
    every position's with ``full_logits``.  With ``shapes.mode ==
    "enumerated"`` the delegate's asset has one statically shaped function per
    ``T`` (1 and the chunk) over one copy of the weights.  ``quantize`` is
    :func:`export_decoder`'s; a list passed as ``quantized_reference``
    receives the quantized program's eager module (taken before lowering,
    which takes over the program's constants), to check the ``.pte`` against; ``keep_float``
    names layers left float (module paths of the decoder, e.g. ``lm_head``, ``layers.0.mlp.down``).
    Lowers with :func:`~coreai_partitioner.lowering.whole_program.lower_whole_program`
    (the delegate takes the decoder whole); returns its ``EdgeProgramManager``,
    whose ``.to_executorch()`` gives the ``.pte``.

    ``target="device"`` (or ``shapes.target``) makes the form upstream's
    on-device Core AI runtime runs (:mod:`.device`): ``forward`` with ``T``
    bounded-dynamic from 1 to ``prefill_chunk`` (``shapes.device_shapes ==
    "static"``: ``forward`` ``T = 1`` and ``prefill`` ``T = prefill_chunk`` over
    one shared asset), caches owned by ExecuTorch, fp16/fp32 tensors only
    across each delegate, backend id ``CoreAIBackend``.  ``graph_breaks=N`` (device form)
    makes a delegate of every ``N`` layers, each a function of the one asset.
    """
    from coreai_partitioner import CoreAIPartitioner
    from coreai_partitioner.lowering.whole_program import decomposition_table, lower_whole_program

    if target is not None and target != shapes.target:
        shapes = dataclasses.replace(shapes, target=target)
    decoder = decoder if decoder is not None else adapt(model, shapes, full_logits=full_logits)
    if shapes.device:
        return _lower_device(
            model, shapes, decoder, quantize, keep_float, quantized_reference, graph_breaks, partitioner_options
        )
    if graph_breaks is not None:
        raise ValueError("graph breaks are the device form's (target='device'); the host form is one delegate")
    program, records = export_decoder(
        model, shapes, quantize=quantize, keep_float=keep_float, decompositions=decomposition_table(), decoder=decoder
    )
    if quantize and quantized_reference is not None:
        quantized_reference.append(program.module())
    partitioner = CoreAIPartitioner(
        externalized_modules=records, input_enumerations=shapes.input_enumerations(), **partitioner_options
    )
    # The decoder's graph is ours and fixed, and its .pte is checked end to end by the tests: no
    # ExecuTorch IR re-verification.  Re-traces run on fake tensors without autograd bookkeeping.
    with torch.no_grad():
        return lower_whole_program(
            program,
            partitioner,
            constant_methods=runner_metadata(model, shapes),
            compile_config=_compat.unverified_compile_config(),
        )


def _lower_device(
    model: nn.Module,
    shapes: DecoderShapes,
    decoder: Decoder,
    quantize: Any,
    keep_float: Sequence[str],
    quantized_reference: list | None,
    graph_breaks: int | None,
    partitioner_options: dict[str, Any],
):
    """:func:`lower_decoder`'s device form (:mod:`.device`): an export per method (one bounded ``forward``, or
    static ``forward`` and ``prefill``), functions of one shared asset."""
    from coreai_partitioner import CoreAIPartitioner
    from coreai_partitioner.lowering.whole_program import decomposition_table, lower_whole_programs
    from coreai_partitioner.llm.device import check_device
    from coreai_partitioner.lowering.device import check_delegates, executorch_config, relabel_backend

    check_device(decoder, shapes.prefill_chunk, graph_breaks)
    refused = {"take_over_mutable_buffer", "input_enumerations", "share_asset", "uses_sidecar"} & set(partitioner_options)
    if refused:
        raise ValueError(
            f"the device form sets {', '.join(sorted(refused))} itself (inline, stateless, one function per method); "
            "leave them out"
        )
    methods = {}
    for method, length in shapes.methods().items():
        program, records = export_decoder(
            model, shapes, quantize=quantize, keep_float=keep_float, decompositions=decomposition_table(),
            decoder=decoder, length=length, layers_per_delegate=graph_breaks,
        )
        if quantize and quantized_reference is not None and method == "forward":
            quantized_reference.append(program.module())
        partitioner = CoreAIPartitioner(
            externalized_modules=records, take_over_mutable_buffer=False, share_asset=True, **partitioner_options
        )
        methods[method] = (program, partitioner)
    with torch.no_grad():
        edge = lower_whole_programs(
            methods,
            constant_methods=runner_metadata(model, shapes),
            compile_config=_compat.unverified_compile_config(),
            executorch_config=executorch_config,
        )
    relabel_backend(edge)
    check_delegates(edge, bounded=shapes.prefill_chunk if shapes.bounded else None)
    return edge


def first_layers(config: Any, layers: int) -> Any:
    """A copy of ``config`` with only its first ``layers`` decoder layers (Apple's exporter's ``--num-layers``).

    Every per-layer list (``layer_types``, ``no_rope_layers``, ...) is cut to
    match, and a family's own per-layer fields by its ``first_layers(text_config,
    total, layers)`` (Gemma 4's shared-KV layers).  Loading a checkpoint with it
    reads only those layers' weights.
    """
    import copy

    from coreai_partitioner.llm.families import registry

    config = copy.deepcopy(config)
    text = config.get_text_config()
    total = text.num_hidden_layers
    if not 1 <= layers <= total:
        raise ValueError(f"num_layers {layers}: the model has {total} layers; give 1 to {total}")
    per_layer = {name: value[:layers] for name, value in vars(text).items() if isinstance(value, list) and len(value) == total}
    text.num_hidden_layers = layers
    for name, value in per_layer.items():
        setattr(text, name, value)
    cut = getattr(registry().get(text.model_type), "first_layers", None)
    if cut is not None:
        cut(text, total, layers)
    return config


@dataclass(frozen=True)
class Plan:
    """What :func:`lower_decoder` would make of a config: read off its decoder on the meta device."""

    model_type: str
    family: str
    layers: int
    windows: dict[int, int]  # window size -> sliding layers
    composites: dict[str, int]
    plain: list[tuple[str, str]]
    shapes: DecoderShapes
    weight_bytes: int
    state_bytes: int
    dtype: torch.dtype
    full_logits: bool

    def __str__(self) -> str:
        mb = 1e6
        sliding = ", ".join(f"{count} sliding over {size}" for size, count in sorted(self.windows.items()))
        full = self.layers - sum(self.windows.values())
        lines = [
            f"{self.model_type} (family {self.family}): {self.layers} layer(s), {full} full attention"
            + (f", {sliding}" if sliding else ""),
            f"  forward(tokens [1, T], input_pos [T]) -> logits [1, {'T' if self.full_logits else '1'}, vocab]; "
            f"T {self.shapes.mode} "
            + (f"1..{self.shapes.prefill_chunk}" if self.shapes.mode == "dynamic" else f"{{1, {self.shapes.prefill_chunk}}}")
            + f", context {self.shapes.max_context_len}",
            "  composites: " + ", ".join(f"{name} x{count}" for name, count in sorted(self.composites.items())),
        ]
        lines += [f"  plain ops: {path} ({reason})" for path, reason in self.plain]
        lines.append(
            f"  weights {self.weight_bytes / mb:,.1f} MB ({str(self.dtype).replace('torch.', '')}), the .pte about "
            f"as much; delegate state (caches) {self.state_bytes / mb:,.1f} MB"
        )
        return "\n".join(lines)


def plan(config: Any, shapes: DecoderShapes, *, dtype: torch.dtype = torch.float32, full_logits: bool = False) -> Plan:
    """:class:`Plan` for ``config``: its model and decoder built on the meta device, so nothing is allocated.

    The composites are counted from one ``forward`` on fake tensors: each
    call of a composite module is one call site of the asset.
    """
    import collections

    from transformers import AutoModelForCausalLM

    from coreai_partitioner.records.specs import default_specs
    from coreai_partitioner.llm.blocks import Attention
    from coreai_partitioner.llm.families import family_of

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        decoder = adapt(model, shapes, full_logits=full_logits)
    names = {spec.target_class: spec.composite_op_name for spec in default_specs()}
    calls: collections.Counter = collections.Counter()
    hooks = [
        module.register_forward_pre_hook(lambda module, args: calls.update([names[type(module)]]))
        for module in decoder.modules()
        if type(module) in names
    ]
    try:
        # Fake tensors over the meta parameters: the delta rule's while_loop reads its trip count, which a
        # meta tensor cannot give.
        with torch.no_grad(), _compat.fake_mode(), torch.device("meta"):
            decoder(torch.zeros(1, 2, dtype=torch.long), torch.arange(2))
    finally:
        for hook in hooks:
            hook.remove()
    windows = collections.Counter(m.window for m in decoder.modules() if isinstance(m, Attention) and m.window)
    text = model.config.get_text_config()
    return Plan(
        model_type=text.model_type,
        family=family_of(model).__name__.rsplit(".", 1)[-1] + ".py",
        layers=text.num_hidden_layers,
        windows=dict(windows),
        composites=dict(calls),
        plain=list(decoder.plain),
        shapes=shapes,
        weight_bytes=sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values()),
        state_bytes=sum(b.numel() * b.element_size() for _, b in state_buffers(decoder)),
        dtype=dtype,
        full_logits=full_logits,
    )

