"""One ``.pte`` with ``encoder`` and ``text_decoder``, each a Core AI delegate, both functions of one asset.

:func:`lower_text2text` exports the two modules of :func:`~.t5.adapt` (their
composites externalized: SDPA, ``rms_norm``), ``encoder``'s input and
``text_decoder``'s cross-attention keys and values dynamic in ``T`` up to
``max_input_len``, lowers both in one ``to_backend`` call to one asset (each
weight stored once), and adds the constant methods an app and
optimum-executorch's ``ExecuTorchModelForSeq2SeqLM`` read
(:func:`runner_metadata`).  ``target="host"`` keeps the self-attention caches
as Core AI state; ``target="device"`` is the form upstream's on-device
runtime takes (:mod:`.device`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coreai_partitioner.text2text.t5 import Text2Text, adapt

#: What a lowered model is for: this package's host runtime, or upstream's device runtime.
TARGETS = ("host", "device")

#: The methods, in the order an app calls them.
METHODS = ("encoder", "text_decoder")


def samples(text2text: Text2Text) -> dict[str, tuple[torch.Tensor, ...]]:
    """Each method's sample inputs (two input tokens: a length of 1 would be specialized)."""
    dtype = text2text.decoder.embed.weight.dtype
    return {
        "encoder": (torch.ones(1, 2, dtype=torch.long),),
        "text_decoder": (
            torch.zeros(1, 1, dtype=torch.long),
            torch.zeros(1, text2text.cross_heads, 2, text2text.head_dim, dtype=dtype),
            torch.zeros(1, dtype=torch.long),
        ),
    }


def dynamic_shapes(text2text: Text2Text) -> dict[str, Any]:
    """``T``, the input's length, from 1 to ``max_input_len``: ``encoder``'s ``input_ids`` and ``text_decoder``'s ``cross``."""
    length = torch.export.Dim("T", min=1, max=text2text.max_input_len)
    return {"encoder": ({1: length},), "text_decoder": (None, {2: length}, None)}


def runner_metadata(model: nn.Module, text2text: Text2Text) -> dict[str, Any]:
    """The constant methods: ``decoder_start_token_id``, the EOS ids (``get_eos_ids``; optimum reads one,
    ``get_eos_id``), ``get_max_seq_len`` (the cache's slots: the decode stops before it),
    ``max_hidden_seq_length`` (the longest input ``encoder`` takes), ``get_vocab_size``."""
    config = model.config
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    eos = config.eos_token_id if eos is None else eos
    start = getattr(generation, "decoder_start_token_id", None)
    start = config.decoder_start_token_id if start is None else start
    eos_ids = [eos] if isinstance(eos, int) else list(eos)
    return {
        "get_eos_ids": eos_ids,
        "get_eos_id": eos_ids[0],
        "decoder_start_token_id": int(start),
        "get_max_seq_len": text2text.decoder.max_decode_len,
        "max_hidden_seq_length": text2text.max_input_len,
        "get_vocab_size": config.vocab_size,
        "use_kv_cache": True,
    }


def lower_text2text(
    model: nn.Module,
    *,
    target: str = "host",
    max_decode_len: int | None = None,
    max_input_len: int | None = None,
    text2text: Text2Text | None = None,
    metadata: dict[str, Any] | None = None,
    phases: dict[str, float] | None = None,
    **partitioner_options: Any,
):
    """Export and lower a ``T5ForConditionalGeneration`` to methods ``encoder`` and ``text_decoder``.

    ``max_decode_len`` is the self-attention cache length, ``max_input_len``
    the longest input (both T5's ``n_positions``, 512, by default).  Returns
    the ``EdgeProgramManager``; its ``.to_executorch()`` is the ``.pte``.
    ``metadata`` adds constant methods to :func:`runner_metadata`'s, which win
    where both name one.  ``phases``, when given, receives the seconds of each
    phase.
    """
    from coreai_partitioner.lowering.methods import lower_method_modules
    from coreai_partitioner.text2text.device import DeviceEncoder
    from coreai_partitioner.text_decoder.device import DeviceTextDecoder

    if target not in TARGETS:
        raise ValueError(f"target {target!r}: choose one of {', '.join(TARGETS)}")
    text2text = text2text if text2text is not None else adapt(model, max_decode_len, max_input_len)
    device = target == "device"
    modules = {
        "encoder": DeviceEncoder(text2text.encoder) if device else text2text.encoder,
        "text_decoder": DeviceTextDecoder(text2text.decoder) if device else text2text.decoder,
    }
    return lower_method_modules(
        modules, samples(text2text), device=device, constant_methods={**(metadata or {}), **runner_metadata(model, text2text)},
        dynamic_shapes=dynamic_shapes(text2text), bounded=text2text.max_input_len if device else None, phases=phases,
        **partitioner_options,
    )
