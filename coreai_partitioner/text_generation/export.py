"""One ``.pte`` for ExecuTorch's LLM runner: export, lowering, and the plan of both.

:func:`lower_decoder` makes the program an on-device LLM ships, in the form
ExecuTorch's LLM runner (``extension/llm/runner``) reads: one ``forward(tokens
[1, T], input_pos [T]) -> logits`` over static caches held as Core AI delegate
state, ``T`` from 1 to a prefill chunk (a whole prompt in one call, or one
token), embedding, decoder and lm_head in one delegate, and the runner's
metadata methods (:func:`~coreai_partitioner.text_decoder.shapes.runner_metadata`).
:class:`~coreai_partitioner.text_decoder.shapes.DecoderShapes` picks dynamic ``T`` or
enumerated ``T`` in {1, chunk}.

The road is one way down, :func:`lower_with_adapters`: the adapters' slots,
the decoder and the runner's limits (:mod:`coreai_partitioner.text_decoder`),
its export, the lowering tail every task ends with
(:func:`~coreai_partitioner.lowering.methods.lower_methods`), then each
adapter's program bound (:mod:`.adapters`).  :func:`lower_decoder` is its
base program (a ``PeftModel``'s adapter program, :func:`lower_peft_model`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from coreai_partitioner import _compat
from coreai_partitioner.text_decoder.recompose import adapt
from coreai_partitioner.text_decoder.decoder import Decoder, state_buffers
from coreai_partitioner.text_decoder.export import export_decoder
from coreai_partitioner.text_decoder.shapes import DecoderShapes, runner_metadata


def lower_decoder(model: nn.Module, shapes: DecoderShapes, **options: Any):
    """Export and lower ``model`` (a transformers causal LM) to one ``forward`` method in one Core AI delegate, with
    runner metadata: the ``EdgeProgramManager``, whose ``.to_executorch()`` gives the ``.pte``.

    ``options`` are :func:`lower_with_adapters`' (the base's program of a
    lowering with no adapters): ``full_logits``, ``quantize``, ``keep_float``,
    ``quantized_reference``, ``decoder``, ``target``, ``graph_breaks``, ``kv_cache``, ``attention_sink`` and the
    partitioner's.  A ``PeftModel`` is lowered with its active LoRA adapter
    kept low rank beside the base layers: that adapter's program
    (:func:`lower_peft_model`).
    """
    if _is_peft_model(model):
        return lower_peft_model(model, shapes, **options)
    return lower_with_adapters(model, shapes, (), **options).base


def _is_peft_model(model: Any) -> bool:
    """Whether ``model`` is PEFT's ``PeftModel`` (by its class's module: PEFT need not be installed)."""
    return any(cls.__module__.startswith("peft.") and cls.__name__ == "PeftModel" for cls in type(model).__mro__)


def lower_with_adapters(
    model: nn.Module,
    shapes: DecoderShapes,
    adapters: Sequence[Any] = (),
    *,
    max_rank: int | None = None,
    full_logits: bool = False,
    quantize: Any = None,
    keep_float: Sequence[str] = (),
    quantized_reference: list | None = None,
    decoder: Decoder | None = None,
    target: str | None = None,
    graph_breaks: int | None = None,
    kv_cache: str = "fp",
    attention_sink: int | None = None,
    **partitioner_options: Any,
):
    """``model`` (a transformers causal LM) exported and lowered once, with a slot for every layer ``adapters``
    target: the :class:`~coreai_partitioner.text_generation.adapters.AdapterPrograms`, the base program and one
    program per adapter, whose ``save`` writes ``model.pte``, ``model.ptd`` and ``NAME.pte``.

    ``forward(tokens [1, T], input_pos [T])`` returns the last position's
    logits (``[1, 1, vocab]``), or every position's with ``full_logits``;
    embedding, decoder and lm_head are one Core AI delegate, with the runner's
    metadata methods (:func:`~coreai_partitioner.text_decoder.shapes.runner_metadata`).
    With ``shapes.mode == "enumerated"`` the delegate's asset has one
    statically shaped function per ``T`` (1 and the chunk) over one copy of
    the weights.  ``quantize`` is :func:`~coreai_partitioner.text_decoder.export.export_decoder`'s;
    a list passed as ``quantized_reference`` receives the quantized program's
    eager module (taken before lowering, which takes over the program's
    constants), to check the ``.pte`` against; ``keep_float`` names layers
    left float (module paths of the decoder, e.g. ``lm_head``,
    ``layers.0.mlp.down``).  Lowers with
    :func:`~coreai_partitioner.lowering.methods.lower_methods`, the tail of
    every task (the delegate takes the decoder whole).

    ``target="device"`` (or ``shapes.target``) makes the form upstream's
    on-device Core AI runtime runs (:mod:`coreai_partitioner.text_decoder.device`): ``forward`` with ``T``
    bounded-dynamic from 1 to ``prefill_chunk`` (``shapes.device_shapes ==
    "static"``: ``forward`` ``T = 1`` and ``prefill`` ``T = prefill_chunk`` over
    one shared asset), caches owned by ExecuTorch, fp16/fp32 tensors only
    across each delegate, backend id ``CoreAIBackend``.  ``graph_breaks=N`` (device form)
    makes a delegate of every ``N`` layers, each a function of the one asset.  A per-block integer ``quantize``
    (``"int4"``) in the device form warns once (Apple's coreai-models #279: such weights come out wrong on the
    Neural Engine; :func:`~coreai_partitioner.quantize.schemes.warn_per_block_int_on_device`).
    ``kv_cache="int8"`` stores every KV cache as int8 with a scale per token
    and head (:mod:`coreai_partitioner.blocks.quantized_cache`), in either form.
    ``attention_sink=S`` (host form, dynamic shapes) makes each full-attention
    cache of ``shapes.max_context_len`` slots hold ``S`` sink tokens and a
    ring of the rest (:mod:`coreai_partitioner.blocks.sinks`), and tells the
    runner a context of :data:`~coreai_partitioner.blocks.sinks.POSITIONS`
    so that generation goes on past the cache.

    ``adapters`` (LoRA adapters read by
    :func:`~coreai_partitioner.adapters.config.read_adapter`) each get a slot
    on every linear layer they target (:mod:`coreai_partitioner.text_decoder.slots`),
    each slot's pair an input of ``forward``, its rank from 1 to ``max_rank``
    (default: the adapters' largest), the pairs in the model's floating
    dtype; the weights go to the data file whatever ``external_data`` says,
    which is what lets the programs share them.  Without adapters the base
    is the program, and ``external_data=True`` (a partitioner option) keeps
    its weights out of the ``.pte`` (:mod:`coreai_partitioner.lowering.external_data`).
    """
    from coreai_partitioner.lowering.lower import reads_stack_traces
    from coreai_partitioner.lowering.methods import lower_methods
    from coreai_partitioner.lowering.whole_program import decomposition_table
    from coreai_partitioner.quantize.schemes import warn_per_block_int_on_device
    from coreai_partitioner.blocks.quantized_cache import quantize_kv_caches
    from coreai_partitioner.blocks.sinks import POSITIONS, UnsupportedSinks, attention_sinks
    from coreai_partitioner.text_decoder.device import check_device
    from coreai_partitioner.text_decoder.slots import adapter_slots
    from coreai_partitioner.text_generation.adapters import AdapterPrograms, bind_adapters, check_adapters
    from coreai_partitioner.text_decoder.verify import verifying

    if target is not None and target != shapes.target:
        shapes = dataclasses.replace(shapes, target=target)
    if graph_breaks is not None and not shapes.device:
        raise ValueError("graph breaks are the device form's (target='device'); the host form is one delegate")
    if adapters:
        max_rank = check_adapters(adapters, shapes, max_rank)
        partitioner_options = {**partitioner_options, "external_data": True}
    stack_traces = reads_stack_traces(partitioner_options)
    with adapter_slots(model, adapters, max_rank) if adapters else contextlib.nullcontext() as slots:
        decoder = decoder if decoder is not None else adapt(model, shapes, full_logits=full_logits)
        quantize_kv_caches(decoder, kv_cache)
        if attention_sink:
            if shapes.device or shapes.mode != "dynamic":
                raise UnsupportedSinks(
                    f"{decoder.model_type}: attention sinks are built for the host form's dynamic shapes; leave out "
                    "--target device and --shapes enumerated"
                )
            attention_sinks(decoder, attention_sink, shapes.prefill_chunk)
        if shapes.device:
            check_device(decoder, shapes.prefill_chunk, graph_breaks)
            warn_per_block_int_on_device(quantize)
        metadata = runner_metadata(model, shapes)
        if attention_sink:  # the cache never fills: the runner may go on to the positions' limit
            metadata["get_max_context_len"] = POSITIONS

        def exported():
            table = decomposition_table()
            for method, length in shapes.methods().items():  # forward, the static layout's prefill, verify
                with verifying(decoder) if method == "verify" else contextlib.nullcontext():
                    program, records = export_decoder(
                        model, shapes, quantize=quantize, keep_float=keep_float, decompositions=table,
                        decoder=decoder, length=length, layers_per_delegate=graph_breaks, slots=slots,
                        stack_traces=stack_traces,
                    )
                if quantize and quantized_reference is not None and method == "forward":
                    quantized_reference.append(program.module())
                yield method, (program, records)

        # With adapter slots, the ranks are symbolic until each adapter is bound: bind_adapters checks the device
        # form's bound programs.
        edge = lower_methods(
            exported(), device=shapes.device, constant_methods=metadata,
            bounded=shapes.prefill_chunk if shapes.bounded else None, check=not adapters,
            input_enumerations=shapes.input_enumerations(), **partitioner_options,
        )
    return bind_adapters(edge, slots, adapters, shapes) if adapters else AdapterPrograms(edge)


def lower_peft_model(model: nn.Module, shapes: DecoderShapes, **options: Any):
    """A ``PeftModel``'s active LoRA adapter lowered low rank over its base: the adapter's ``EdgeProgramManager``.

    PEFT's layers are left as they are; the base model's linear layers take
    the adapter's pairs as constants (:func:`lower_with_adapters`, whose ``options`` these are).
    """
    from coreai_partitioner.adapters.config import AdapterError, adapter_of_peft_model

    if str(getattr(model, "peft_type", "LORA")).upper().rsplit(".", 1)[-1] != "LORA":
        raise AdapterError(f"PeftModel of peft_type {model.peft_type}: only LoRA adapters are lowered")
    if options.pop("quantized_reference", None) is not None:
        raise AdapterError(
            "quantized_reference is not taken with a PeftModel: lower_with_adapters(base, shapes, [adapter], "
            "quantized_reference=) takes it"
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
            *([f"  verify(tokens [1, {v}], input_pos [{v}]) -> logits [1, {v}, vocab]: drafts of up to {v - 1} "
               "(docs/speculative.md)"] if (v := self.shapes.verify_tokens) else []),
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

