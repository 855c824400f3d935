"""One ``.pte`` for ExecuTorch's LLM runner: export, lowering, and the plan of both.

:func:`lower_decoder` makes the program an on-device LLM ships, in the form
ExecuTorch's LLM runner (``extension/llm/runner``) reads: one ``forward(tokens
[1, T], input_pos [T]) -> logits`` over static caches held as Core AI delegate
state, ``T`` from 1 to a prefill chunk (a whole prompt in one call, or one
token), embedding, decoder and lm_head in one delegate, and the runner's
metadata methods (:func:`~coreai_partitioner.text_decoder.shapes.runner_metadata`).
:class:`~coreai_partitioner.text_decoder.shapes.DecoderShapes` picks dynamic ``T`` or
enumerated ``T`` in {1, chunk}.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from coreai_partitioner import _compat
from coreai_partitioner.text_decoder.adapter import adapt
from coreai_partitioner.text_decoder.decoder import Decoder, state_buffers
from coreai_partitioner.text_decoder.shapes import DecoderShapes, runner_metadata


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
    slots: Any = None,
    stack_traces: bool = True,
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
    names.  Every shape is checked against the scheme before any work.  ``slots`` (an
    :class:`~coreai_partitioner.adapters.slots.AdapterSlots` over ``model``'s layers) adds each slot's
    ``A`` and ``B`` as inputs after ``tokens`` and ``input_pos``, their ranks symbolic.  ``stack_traces`` is
    :func:`~coreai_partitioner.lowering.lower.export_with_composites`'s.
    """
    from coreai_partitioner.lowering.lower import export_with_composites

    decoder = decoder if decoder is not None else adapt(model, shapes, full_logits=full_logits)
    exported: nn.Module = decoder
    if shapes.device:
        from coreai_partitioner.text_decoder.device import DeviceDecoder

        exported = DeviceDecoder(decoder, layers_per_delegate)
    dynamic_shapes = None
    if length is None:
        length = min(2, shapes.prefill_chunk)
        if shapes.prefill_chunk > 1:
            tokens_dim = torch.export.Dim("T", min=1, max=shapes.prefill_chunk)
            dynamic_shapes = ({1: tokens_dim}, {0: tokens_dim})
    sample = (torch.zeros(1, length, dtype=torch.long), torch.arange(length))
    if slots is not None:
        from coreai_partitioner.adapters.slots import AdapterInputs

        exported = AdapterInputs(exported, slots, ("tokens", "input_pos"))
        sample = (*sample, *slots.inputs(slots.zero_pairs(_dtype_of(decoder), rank=slots.sample_rank)))
        dynamic_shapes = (*(dynamic_shapes or (None, None)), *slots.dynamic_shapes())

    routers = []
    if quantize:  # the experts feed gather_mm, so they are compressed here; quantize() stores the rest
        from coreai_partitioner.quantize.program_weights import is_kept
        from coreai_partitioner.quantize import check_model
        from coreai_partitioner.blocks import MoE

        experts = {p: m for p, m in decoder.named_modules() if isinstance(m, MoE) and not is_kept(p, p, keep_float)}
        check_model(decoder, quantize, keep_float=keep_float)
        for path, module in experts.items():
            if not module.forms:  # the device form exports the decoder once per method
                module.quantize_experts(quantize, path)
            routers.append(f"{path}.router")  # routing stays float: quantized logits would pick other experts
    # The program names the decoder's weights from the exported module: the device form's wraps it.
    prefix = next(f"{path}." if path else "" for path, module in exported.named_modules() if module is decoder)
    program, records = export_with_composites(
        exported, sample, dynamic_shapes=dynamic_shapes, quantize=quantize or None,
        keep_float=[prefix + path for path in (*keep_float, *routers)], decompositions=decompositions,
        annotations=shapes.device, stack_traces=stack_traces,
    )
    if slots is not None:
        from coreai_partitioner.adapters.slots import check_slots_used

        check_slots_used(program, slots, 2)
    return program, records


def _dtype_of(decoder: nn.Module) -> torch.dtype:
    """The floating dtype the decoder computes in: its first floating parameter's."""
    return next(p.dtype for p in decoder.parameters() if p.is_floating_point())


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
    slots: Any = None,
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
    Lowers with :func:`~coreai_partitioner.lowering.methods.lower_methods`, the tail of every task
    (the delegate takes the decoder whole); returns its ``EdgeProgramManager``,
    whose ``.to_executorch()`` gives the ``.pte``.

    ``target="device"`` (or ``shapes.target``) makes the form upstream's
    on-device Core AI runtime runs (:mod:`.device`): ``forward`` with ``T``
    bounded-dynamic from 1 to ``prefill_chunk`` (``shapes.device_shapes ==
    "static"``: ``forward`` ``T = 1`` and ``prefill`` ``T = prefill_chunk`` over
    one shared asset), caches owned by ExecuTorch, fp16/fp32 tensors only
    across each delegate, backend id ``CoreAIBackend``.  ``graph_breaks=N`` (device form)
    makes a delegate of every ``N`` layers, each a function of the one asset.

    A ``PeftModel`` is lowered with its active LoRA adapter kept low rank
    beside the base layers (:func:`lower_peft_model`).
    ``slots`` (:func:`lower_with_adapters`'s) makes each adapter slot's
    pair an input of ``forward``.  ``external_data=True`` (a partitioner option) keeps the weights out of the
    ``.pte`` (:mod:`coreai_partitioner.lowering.external_data`).
    """
    from coreai_partitioner.lowering.lower import reads_stack_traces
    from coreai_partitioner.lowering.methods import lower_methods
    from coreai_partitioner.lowering.whole_program import decomposition_table

    if _is_peft_model(model):
        return lower_peft_model(
            model, shapes, full_logits=full_logits, quantize=quantize, keep_float=keep_float,
            quantized_reference=quantized_reference, target=target, graph_breaks=graph_breaks, **partitioner_options,
        )
    if target is not None and target != shapes.target:
        shapes = dataclasses.replace(shapes, target=target)
    decoder = decoder if decoder is not None else adapt(model, shapes, full_logits=full_logits)
    if shapes.device:
        return _lower_device(
            model, shapes, decoder, quantize, keep_float, quantized_reference, graph_breaks, slots, partitioner_options
        )
    if graph_breaks is not None:
        raise ValueError("graph breaks are the device form's (target='device'); the host form is one delegate")
    program, records = export_decoder(
        model, shapes, quantize=quantize, keep_float=keep_float, decompositions=decomposition_table(), decoder=decoder,
        slots=slots, stack_traces=reads_stack_traces(partitioner_options),
    )
    if quantize and quantized_reference is not None:
        quantized_reference.append(program.module())
    return lower_methods(
        [("forward", (program, records))], device=False, constant_methods=runner_metadata(model, shapes),
        input_enumerations=shapes.input_enumerations(), **partitioner_options,
    )


def _lower_device(
    model: nn.Module,
    shapes: DecoderShapes,
    decoder: Decoder,
    quantize: Any,
    keep_float: Sequence[str],
    quantized_reference: list | None,
    graph_breaks: int | None,
    slots: Any,
    partitioner_options: dict[str, Any],
):
    """:func:`lower_decoder`'s device form (:mod:`coreai_partitioner.text_decoder.device`): an export per method (one bounded ``forward``, or
    static ``forward`` and ``prefill``), functions of one shared asset."""
    from coreai_partitioner.text_decoder.device import check_device
    from coreai_partitioner.lowering.lower import reads_stack_traces
    from coreai_partitioner.lowering.methods import lower_methods
    from coreai_partitioner.lowering.whole_program import decomposition_table

    check_device(decoder, shapes.prefill_chunk, graph_breaks)

    def exported():
        for method, length in shapes.methods().items():
            program, records = export_decoder(
                model, shapes, quantize=quantize, keep_float=keep_float, decompositions=decomposition_table(),
                decoder=decoder, length=length, layers_per_delegate=graph_breaks, slots=slots,
                stack_traces=reads_stack_traces(partitioner_options),
            )
            if quantize and quantized_reference is not None and method == "forward":
                quantized_reference.append(program.module())
            yield method, (program, records)

    # With adapter slots, the ranks are symbolic until each adapter is bound; the bound programs are checked.
    return lower_methods(
        exported(), device=True, constant_methods=runner_metadata(model, shapes),
        bounded=shapes.prefill_chunk if shapes.bounded else None, check=slots is None, **partitioner_options,
    )


def _is_peft_model(model: Any) -> bool:
    """Whether ``model`` is PEFT's ``PeftModel`` (by its class's module: PEFT need not be installed)."""
    return any(cls.__module__.startswith("peft.") and cls.__name__ == "PeftModel" for cls in type(model).__mro__)


def lower_with_adapters(
    model: nn.Module,
    shapes: DecoderShapes,
    adapters: Sequence[Any],
    *,
    max_rank: int | None = None,
    **options: Any,
):
    """``model`` (a transformers causal LM) lowered once with a slot for every layer ``adapters`` target; the
    base program and one program per adapter (:class:`~coreai_partitioner.text_generation.adapters.AdapterPrograms`;
    its ``save`` writes ``model.pte``, ``model.ptd`` and ``NAME.pte``).

    ``options`` are :func:`lower_decoder`'s (``quantize`` compresses the base
    weights; the pairs stay in the model's floating dtype).  ``max_rank``
    (default: the largest rank of ``adapters``) bounds the rank a slot
    takes.  The weights go to the data file whatever ``external_data`` says:
    that is what lets the programs share them.
    """
    from coreai_partitioner.adapters.slots import adapter_slots
    from coreai_partitioner.text_generation.adapters import bind_adapters, check_adapters

    target = options.pop("target", None)
    if target is not None and target != shapes.target:
        shapes = dataclasses.replace(shapes, target=target)
    max_rank = check_adapters(adapters, shapes, max_rank)
    targeted = {path for adapter in adapters for path in adapter.layers}
    paths = [path for path, _ in model.named_modules() if path in targeted]
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    with adapter_slots(model, paths, max_rank) as slots:
        for adapter in adapters:
            slots.pairs_of(adapter, dtype)  # every layer it targets has a slot, before the lowering
        edge = lower_decoder(model, shapes, slots=slots, **{**options, "external_data": True})
    return bind_adapters(edge, slots, adapters, shapes, dtype)


def lower_peft_model(model: nn.Module, shapes: DecoderShapes, **options: Any):
    """A ``PeftModel``'s active LoRA adapter lowered low rank over its base: the adapter's ``EdgeProgramManager``.

    PEFT's layers are left as they are; the base model's linear layers take
    the adapter's pairs as constants (:func:`lower_with_adapters`).
    """
    from coreai_partitioner.adapters.config import AdapterError, adapter_of_peft_model

    if str(getattr(model, "peft_type", "LORA")).upper().rsplit(".", 1)[-1] != "LORA":
        raise AdapterError(f"PeftModel of peft_type {model.peft_type}: only LoRA adapters are lowered")
    if options.pop("quantized_reference", None) is not None:
        raise AdapterError(
            "quantized_reference is not taken with a PeftModel: lower_with_adapters(..., quantized_reference=) takes it"
        )
    adapter = adapter_of_peft_model(model)
    return lower_with_adapters(model.get_base_model(), shapes, [adapter], **options).program(adapter.name)


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
    from coreai_partitioner.blocks import Attention
    from coreai_partitioner.text_decoder.families import family_of

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

