"""Hugging Face decoder-only LLMs to one ``.pte`` for ExecuTorch's LLM runner, with Core AI composites.

The road of a checkpoint:

1. **Adapt** (:func:`adapt`, :mod:`coreai_partitioner.text_decoder`, which a
   vision-language model's text half shares).  ``config.model_type`` picks
   the family file; its ``build`` re-composes the model's layers from
   :mod:`coreai_partitioner.blocks` over the model's own modules and weights (nothing copied):
   RMSNorms through the ``rms_norm`` composite, attention through
   ``rope`` and ``scaled_dot_product_attention``, each over a static cache
   the attention module owns (a ring of ``window`` slots for a sliding
   layer).  A module whose math is not a composite's stays plain ops and is
   logged with the reason; a model no family adapts, or a config value its
   family cannot honour, is refused here, before any export work.
2. **Export** (:func:`export_decoder`).  The :class:`Decoder`'s
   ``forward(tokens [1, T], input_pos [T]) -> logits`` is exported with ``T``
   symbolic and its composites externalized (the package's step 1).
3. **Lower** (:func:`lower_decoder`).  One Core AI delegate takes the whole
   step (embedding, layers, lm_head, cache writes) and the caches as its
   state; the runner's metadata methods ride along (:func:`runner_metadata`).
4. **Run** (:func:`greedy_decode`, ExecuTorch's ``TextLLMRunner``).
5. **Verify** (:mod:`.check`): the program's logits and greedy tokens
   against the eager model it was lowered from, within the runtime's rounding
   (:mod:`coreai_partitioner.verify.fidelity`), and against the fp32 model as a report.

``python -m coreai_partitioner export-llm`` (the ``text-generation`` task of :mod:`coreai_partitioner.cli.export`)
is this road from the command line.
"""

from coreai_partitioner import _compat  # noqa: F401 - first: it imports coreai-torch without coreai-torch's false version warning
from coreai_partitioner.text_decoder import (
    DEVICE_SHAPES,
    SHAPE_MODES,
    TARGETS,
    Decoder,
    DecoderShapes,
    UnsupportedConfig,
    UnsupportedModel,
    UnsupportedShapes,
    adapt,
    family_of,
    first_layers,
    reset_state,
    runner_metadata,
    supported,
    tiny_config,
)
from coreai_partitioner.text_generation.check import DecoderReport, Reference
from coreai_partitioner.text_generation.export import Plan, export_decoder, lower_decoder, lower_with_adapters, plan
from coreai_partitioner.text_generation.generate import TextPieces, byte_tokenizer, check_call, decode_tokens, eos_ids_of, greedy_decode, method_for, prefill, prefill_calls

__all__ = [
    "DEVICE_SHAPES",
    "SHAPE_MODES",
    "TARGETS",
    "Decoder",
    "DecoderReport",
    "DecoderShapes",
    "Plan",
    "Reference",
    "TextPieces",
    "UnsupportedConfig",
    "UnsupportedModel",
    "UnsupportedShapes",
    "adapt",
    "byte_tokenizer",
    "check_call",
    "decode_tokens",
    "eos_ids_of",
    "export_decoder",
    "family_of",
    "first_layers",
    "greedy_decode",
    "lower_decoder",
    "lower_with_adapters",
    "method_for",
    "plan",
    "prefill",
    "prefill_calls",
    "reset_state",
    "runner_metadata",
    "supported",
    "tiny_config",
]
