"""The text decoder exported: its composites externalized, ``T`` symbolic or static, its weights stored as a scheme says.

:func:`export_decoder` is the export road of a :class:`~.decoder.Decoder`
(or of its device form, :class:`~.device.DeviceDecoder`), adapter slots
as inputs where there are any (:mod:`.slots`); lowering it is the task's
(``text_generation.lower_decoder``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from coreai_partitioner.text_decoder.recompose import adapt
from coreai_partitioner.text_decoder.decoder import Decoder
from coreai_partitioner.text_decoder.shapes import DecoderShapes


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
    :class:`~coreai_partitioner.text_decoder.slots.AdapterSlots` over ``model``'s layers) adds each slot's
    ``A`` and ``B`` as inputs after ``tokens`` and ``input_pos``, their ranks symbolic.  ``stack_traces`` is
    :func:`~coreai_partitioner.lowering.lower.export_with_composites`'s.  Layers alike are traced once and
    repeated (:mod:`coreai_partitioner.lowering.repeated`), but where a graph break every
    ``layers_per_delegate`` layers reads their index, and with ``slots`` (each slot's layer must be called).
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
        from coreai_partitioner.text_decoder.slots import AdapterInputs

        exported = AdapterInputs(exported, slots, ("tokens", "input_pos"))
        sample = (*sample, *slots.inputs(slots.zero_pairs(slots.dtype, rank=slots.sample_rank)))
        dynamic_shapes = (*(dynamic_shapes or (None, None)), *slots.dynamic_shapes())

    routers = []
    if quantize:  # the experts feed gather_mm, so they are compressed here; quantize() stores the rest
        from coreai_partitioner.quantize.program_weights import is_kept
        from coreai_partitioner.quantize import schemes
        from coreai_partitioner.blocks import MoE

        experts = {p: m for p, m in decoder.named_modules() if isinstance(m, MoE) and not is_kept(p, p, keep_float)}
        # A weight the scheme cannot store (a short convolution's one input channel under int4) stays float, the
        # quantize step warning and naming it, as for any model; the experts are compressed here, so their misfits
        # are refused here.
        planned = [entry for path, module in experts.items() for entry in module.planned(quantize, path)]
        schemes.check_fits(planned, schemes.scheme(quantize).name)
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
        # Layers traced once and repeated, but where the code around them reads a layer's index (a graph break every
        # few layers) or needs every layer called (the adapters' slots, each checked read during the trace).
        repeated=None if layers_per_delegate or slots is not None else f"{prefix}layers",
    )
    return program, records
