"""Export a Hugging Face masked language model (BERT, RoBERTa, DistilBERT) to a .pte of every position's logits.

    python -m coreai_partitioner export --checkpoint path/to/bert-base-uncased --verify --out out/model.pte
    python -m coreai_partitioner export --checkpoint path/to/distilroberta-base --dtype fp16 --max-input-len 128 --verify
    python -m coreai_partitioner export --config bert --verify --out out/model.pte     # a tiny random BERT

(the task is a ``*ForMaskedLM`` checkpoint's.)  The .pte has one method,
``forward(input_ids [B, T] int64, attention_mask [B, T] int64) -> logits
[B, T, vocab]``, the logits of every position, as optimum-executorch's
``ExecuTorchModelForMaskedLM`` reads them: ``T`` from 1 to ``--max-input-len``
(default: every position the checkpoint numbers), ``B`` from 1 to
``--max-batch`` (default 1); one Core AI delegate, attention and the
LayerNorms as composites (:mod:`coreai_partitioner.text_encoder`), plus
``get_max_seq_len`` and ``get_max_batch_size``.  Beside it: the
checkpoint's tokenizer files (``tokenizer.json``, ``vocab.txt``...; a tiny
model's one-character-per-token ``tokenizer.json``).  ``--verify`` judges
the logits of a seeded random text, its last quarter padding, against the
eager model at ``--dtype`` within the runtime's own rounding, and reports
the fp32 model's distance beside them.  Another model type's masked LM
(DeBERTa, ALBERT...) is refused before its weights are loaded.  Host form
only.  Nothing is downloaded.  Needs the hf extra.
"""

from __future__ import annotations

import argparse
from typing import Any

from coreai_partitioner.cli.detect import Detection, Head
from coreai_partitioner.cli.text_encoders import TextEncoderPlan, settle_text
from coreai_partitioner.cli.text_encoders import DEFAULTS, FLAGS, add_flags, tiny_config  # noqa: F401 - the text encoder tasks'
from coreai_partitioner.cli.text_encoders import after, check, describe, dry_run, eager, lower, reference  # noqa: F401 - their steps
from coreai_partitioner.cli.text_encoders import write_tokenizer as companions  # noqa: F401 - its companions: the tokenizer

NAME = "fill-mask"
DETECT = Detection(takes="a *ForMaskedLM: bert, roberta, distilbert", heads=(Head("ForMaskedLM"),))
MODEL = "AutoModelForMaskedLM"
RUNNER = "optimum-executorch's ExecuTorchModelForMaskedLM"


def tiny_configs() -> list[str]:
    from coreai_partitioner.text_encoder.tiny import NAMES

    return list(NAMES[NAME])


def refusals() -> tuple[type[Exception], ...]:
    from coreai_partitioner.text_encoder import UnsupportedTextEncoder

    return (UnsupportedTextEncoder,)


def settle(args: argparse.Namespace, config: Any) -> TextEncoderPlan:
    """A masked LM's checkpoint, a model type a family adapts, the longest input."""
    return settle_text(NAME, args, config)
