"""Text-to-text generation: T5 and Flan-T5 to one ``.pte`` in the speech task's conventions, with Core AI composites.

The road of a checkpoint (``python -m coreai_partitioner export --checkpoint DIR`` for a
``text2text-generation`` one, :mod:`coreai_partitioner.cli.tasks.text2text_generation`):

1. **Adapt** (:func:`adapt`, :mod:`.t5`).  The Hugging Face model's own
   modules re-composed from :mod:`coreai_partitioner.blocks` into the two
   methods speech recognition has: ``encoder(input_ids [1, T]) -> cross``
   (the encoder and every decoder layer's cross-attention keys and values,
   once per input) and ``text_decoder(ids, cross, cache_position) -> logits``
   (one token a call over static self-attention caches).  T5's own parts:
   the relative position bias (:mod:`.position_bias`), no score scaling,
   RMS norms (``rms_norm``), relu or gated-gelu MLPs, the tied head's rescale.
2. **Export and lower** (:func:`lower_text2text`, :mod:`.export`).  Both
   methods exported with their composites externalized (SDPA, ``rms_norm``),
   ``T`` dynamic up to ``max_input_len``, lowered in one call to one Core AI
   asset, a function each; the host form keeps the caches as Core AI state,
   the device form (:mod:`.device`) as ExecuTorch's buffers.
3. **Generate** (:class:`Text2TextProgram`, :mod:`.generate`).  The ``.pte``
   in ExecuTorch's runtime, greedy, by Hugging Face's rules.
4. **Verify** (:mod:`.check`): the encoder's output, the logits and the
   greedy ids against Hugging Face eager.
"""

from coreai_partitioner import _compat  # noqa: F401 - first: it imports coreai-torch without its false version warning
from coreai_partitioner.text2text.export import METHODS, TARGETS, lower_text2text, runner_metadata
from coreai_partitioner.text2text.generate import Text2TextProgram
from coreai_partitioner.text2text.t5 import MODEL_TYPES, Text2Text, UnsupportedText2TextModel, adapt

__all__ = [
    "METHODS",
    "MODEL_TYPES",
    "TARGETS",
    "Text2Text",
    "Text2TextProgram",
    "UnsupportedText2TextModel",
    "adapt",
    "lower_text2text",
    "runner_metadata",
]
