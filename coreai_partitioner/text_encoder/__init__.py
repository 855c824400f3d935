"""BERT-class text encoders to one ``.pte``: ``fill-mask`` logits or ``feature-extraction`` sentence embeddings.

The road of a checkpoint:

1. **Adapt** (:func:`adapt`, :mod:`.families`).  ``config.model_type`` picks
   the family: ``bert``, ``roberta``, ``distilbert``.  Its embeddings, then
   :class:`~coreai_partitioner.blocks.PostNormEncoderLayer` layers over
   the model's own modules (SDPA composite, not causal, with the padding
   mask built from ``attention_mask``; HF's LayerNorms, which coreai-torch
   converts to its ``layer_norm`` composite), then a head: the checkpoint's
   MLM head (:class:`~.model.MaskedLM`) or the pooling its
   sentence-transformers files describe (:mod:`.pooling`:
   ``modules.json``, ``1_Pooling/config.json``, ``Normalize``).  Any other
   type, a relative position embedding, an activation, a sentence module or
   a pooling mode not computed here: refused from the config and files,
   before any work, naming it.
2. **Lower** (:func:`lower_text_encoder`).  ``forward(input_ids [B, T],
   attention_mask [B, T])``, optimum-executorch's method name and inputs,
   ``T`` dynamic up to the positions the checkpoint numbers (or its
   ``max_seq_length``); one Core AI delegate.
3. **Beside it** (:func:`write_tokenizer`): the tokenizer's files (and
   :func:`sentence_files`, the sentence-transformers files that say the pooling).

:mod:`.tiny` makes tiny random models of each type for both tasks;
:mod:`.check` is what ``export --verify`` feeds a ``.pte`` and compares it with.

Other types fit the same families and are left out only untested:
XLM-RoBERTa and CamemBERT are RoBERTa's modules under another name
(``# Copied from`` in transformers), and ELECTRA's discriminator and
generator are BERT's layers (with an embedding projection when its
``embedding_size`` differs from ``hidden_size``).  ALBERT (one layer shared,
factorized embeddings), DeBERTa (disentangled relative attention) and MPNet
(relative position bias) compute attention the SDPA composite does not take
as they are.
"""

from coreai_partitioner import _compat  # noqa: F401 - first: it imports coreai-torch without coreai-torch's false version warning
from coreai_partitioner.text_encoder.errors import UnsupportedSentenceModel, UnsupportedTextEncoder
from coreai_partitioner.text_encoder.export import (
    LEAST_BOUND,
    TASKS,
    TOKENIZER_FILES,
    adapt,
    lower_text_encoder,
    max_seq_len_of,
    tokenizer_files,
    write_tokenizer,
)
from coreai_partitioner.text_encoder.families import family_of, supported
from coreai_partitioner.text_encoder.model import MaskedLM, SentenceEmbedding, TextEncoder, TokenEmbeddings
from coreai_partitioner.text_encoder.pooling import MODES, Pooling, SentenceConfig, read_sentence_config, sentence_files

__all__ = [
    "LEAST_BOUND",
    "MODES",
    "TASKS",
    "TOKENIZER_FILES",
    "MaskedLM",
    "Pooling",
    "SentenceConfig",
    "SentenceEmbedding",
    "TextEncoder",
    "TokenEmbeddings",
    "UnsupportedSentenceModel",
    "UnsupportedTextEncoder",
    "adapt",
    "family_of",
    "lower_text_encoder",
    "max_seq_len_of",
    "read_sentence_config",
    "sentence_files",
    "supported",
    "tokenizer_files",
    "write_tokenizer",
]
