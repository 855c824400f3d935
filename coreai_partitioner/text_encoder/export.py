"""One ``.pte`` whose ``forward(input_ids, attention_mask)`` is a text encoder's task, and its tokenizer beside it.

:func:`adapt` re-composes the Hugging Face model over its own modules
(:mod:`.families`): ``fill-mask`` (:class:`~.model.MaskedLM`, the logits
of every position, as optimum-executorch's ``ExecuTorchModelForMaskedLM``
reads them) or ``feature-extraction`` (:class:`~.model.SentenceEmbedding`,
the pooling of :mod:`.pooling`).  :func:`lower_text_encoder` exports it
with its composites externalized, ``T`` (and ``B`` when ``max_batch`` > 1)
dynamic up to the bounds, and lowers it to one Core AI delegate; the
bounds ride along as constant methods.  :func:`write_tokenizer` puts the
tokenizer files beside the ``.pte``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from coreai_partitioner.text_encoder.families import family_of
from coreai_partitioner.text_encoder.model import MaskedLM, SentenceEmbedding, TextEncoder
from coreai_partitioner.text_encoder.pooling import Pooling, SentenceConfig

logger = logging.getLogger(__name__)

#: The tasks, by optimum-executorch's names.
TASKS = ("fill-mask", "feature-extraction")

#: The least bound of a dynamic length or batch: torch.export takes a dynamic size to be at least 2, so a bound of
#: 2 leaves it one value, which coreai-torch cannot export as a dimension (a bound of 1 is a static size).
LEAST_BOUND = 3

#: The files a checkpoint keeps its tokenizer in (those present are copied).
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt",
    "sentencepiece.bpe.model", "spiece.model", "added_tokens.json",
)


def check(model: nn.Module, task: str, sentence: SentenceConfig | None = None) -> None:
    """Refuse, before any work, a task, a model type or a head this path does not export."""
    if task not in TASKS:
        raise ValueError(f"task {task!r}: the text encoder path exports {', '.join(TASKS)}")
    family_of(model.config)
    if task == "fill-mask" and not hasattr(model, model.base_model_prefix):
        raise ValueError(
            f"{type(model).__name__} has no MLM head: fill-mask exports a {model.config.model_type} ...ForMaskedLM "
            "(AutoModelForMaskedLM); for sentence embeddings use task='feature-extraction'"
        )
    if task == "feature-extraction" and sentence is None:
        raise ValueError(
            "feature-extraction pools the encoder's states as the checkpoint's sentence-transformers modules say: pass "
            "sentence=read_sentence_config(checkpoint_dir), or SentenceConfig(modes=('mean',), normalize=...)"
        )


def adapt(model: nn.Module, task: str = "fill-mask", *, sentence: SentenceConfig | None = None) -> MaskedLM | SentenceEmbedding:
    """``model``'s task over its own modules: :class:`~.model.MaskedLM` for ``fill-mask`` (a ``...ForMaskedLM``),
    :class:`~.model.SentenceEmbedding` for ``feature-extraction`` (the encoder, bare or under a head, pooled as
    ``sentence`` says)."""
    check(model, task, sentence)
    config = model.config
    family = family_of(config)
    base = getattr(model, model.base_model_prefix, model)
    layers = [family.layer(layer, config, f"encoder.layers.{i}") for i, layer in enumerate(family.hf_layers(base))]
    encoder = TextEncoder(config.model_type, family.embeddings(base), layers)
    if task == "fill-mask":
        return MaskedLM(encoder, family.mlm_head(model))
    return SentenceEmbedding(encoder, Pooling(sentence))


def max_seq_len_of(config: Any, sentence: SentenceConfig | None = None) -> int:
    """The longest input by default, from a model's config: the checkpoint's sentence-transformers ``max_seq_length``,
    else all its positions."""
    longest = family_of(config).max_tokens(config)
    return min(longest, sentence.max_seq_length) if sentence is not None and sentence.max_seq_length else longest


def lower_text_encoder(
    model: nn.Module,
    task: str = "fill-mask",
    *,
    sentence: SentenceConfig | None = None,
    max_seq_len: int | None = None,
    max_batch: int = 1,
    metadata: dict[str, Any] | None = None,
    **partitioner_options: Any,
):
    """Export and lower ``model``'s ``task`` to the method ``forward(input_ids [B, T], attention_mask [B, T])``.

    ``T`` runs from 1 to ``max_seq_len`` (default :func:`max_seq_len_of`),
    ``B`` from 1 to ``max_batch``; a longer input than the position table
    numbers is refused here.  Returns the ``EdgeProgramManager``
    (:func:`coreai_partitioner.save_pte` writes it); ``metadata`` adds
    constant methods to ``get_max_seq_len`` and ``get_max_batch_size``, which
    win where both name one (optimum's ``get_max_seq_len`` is the position
    table's length, RoBERTa's longer than the input it numbers).
    """
    from coreai_partitioner.lowering.lower import export_with_composites, reads_stack_traces
    from coreai_partitioner.lowering.methods import lower_methods

    module = adapt(model, task, sentence=sentence)
    longest = family_of(model.config).max_tokens(model.config)
    max_seq_len = max_seq_len if max_seq_len is not None else max_seq_len_of(model.config, sentence)
    if not LEAST_BOUND <= max_seq_len <= longest:
        raise ValueError(
            f"{model.config.model_type}: max_seq_len={max_seq_len}, and its position table numbers {longest} tokens; "
            f"choose {LEAST_BOUND} to {longest} (a bound of 2 is one length to torch.export: LEAST_BOUND)"
        )
    if not (max_batch == 1 or max_batch >= LEAST_BOUND):
        raise ValueError(f"max_batch={max_batch}: give 1 or at least {LEAST_BOUND} (a bound of 2 is one size to torch.export: LEAST_BOUND)")
    batch = min(2, max_batch)
    sample = (torch.zeros(batch, 2, dtype=torch.long), torch.ones(batch, 2, dtype=torch.long))
    length = torch.export.Dim("T", min=1, max=max_seq_len)
    dims = {1: length} if max_batch == 1 else {0: torch.export.Dim("B", min=1, max=max_batch), 1: length}
    logger.info("%s %s: %d layer(s), T up to %d, B up to %d", model.config.model_type, task, len(module.encoder.layers), max_seq_len, max_batch)
    exported = export_with_composites(
        module, sample, dynamic_shapes=(dims, dims), stack_traces=reads_stack_traces(partitioner_options)
    )
    constants = {**(metadata or {}), "get_max_seq_len": max_seq_len, "get_max_batch_size": max_batch}
    return lower_methods([("forward", exported)], device=False, constant_methods=constants, **partitioner_options)


def tokenizer_files(directory: str | Path) -> list[Path]:
    """The files of :data:`TOKENIZER_FILES` a checkpoint ``directory`` holds."""
    return [Path(directory) / name for name in TOKENIZER_FILES if (Path(directory) / name).is_file()]


def write_tokenizer(source: Any, directory: str | Path) -> list[Path]:
    """The tokenizer files beside the ``.pte`` in ``directory``: a tokenizer's ``save_pretrained``, or those of
    :data:`TOKENIZER_FILES` a checkpoint directory ``source`` holds.  Returns the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if hasattr(source, "save_pretrained"):
        return [Path(path) for path in source.save_pretrained(str(directory)) if Path(path).is_file()]
    present = tokenizer_files(source)
    if not present:
        raise FileNotFoundError(
            f"{source} holds none of {', '.join(TOKENIZER_FILES)}: pass the tokenizer (AutoTokenizer.from_pretrained) instead"
        )
    return [Path(shutil.copy2(path, directory / path.name)) for path in present]
