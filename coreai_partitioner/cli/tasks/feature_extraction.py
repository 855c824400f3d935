"""Export a sentence-transformers checkpoint (a BERT, RoBERTa or DistilBERT encoder) to a .pte of sentence embeddings.

    python -m coreai_partitioner export --checkpoint path/to/all-MiniLM-L6-v2 --verify --out out/model.pte
    python -m coreai_partitioner export --checkpoint path/to/all-MiniLM-L6-v2 --max-batch 8 --dtype fp16 --verify
    python -m coreai_partitioner export --config sentence-bert --verify        # a tiny random BERT, mean pooled

(the task is a checkpoint's with sentence-transformers' ``modules.json``.)
The .pte has one method, ``forward(input_ids [B, T] int64, attention_mask
[B, T] int64) -> embeddings [B, D]``: the encoder's states pooled as the
checkpoint's ``modules.json`` and ``1_Pooling/config.json`` say (mean, CLS,
max, mean over the square root of the length, or several concatenated),
at unit length where it lists ``Normalize``, a padded batch giving each
text its own embedding; ``T`` from 1 to ``--max-input-len`` (default: the
checkpoint's ``max_seq_length``, else every position it numbers), ``B``
from 1 to ``--max-batch`` (default 1); one Core AI delegate
(:mod:`coreai_partitioner.text_encoder`).  Beside it: the tokenizer files
and the sentence-transformers files that say the pooling
(``modules.json``, ``1_Pooling/config.json``, ``sentence_bert_config.json``).
``--verify`` judges the embedding of a seeded random text, its last quarter
padding, against Hugging Face's encoder pooled the same way at ``--dtype``,
within the runtime's own rounding, the fp32 model's distance beside it.  A
module or pooling mode not computed here (``Dense``, ``weightedmean``...)
is refused before any weights are loaded.  Host form only.  Nothing is
downloaded.  Needs the hf extra.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from coreai_partitioner.cli.detect import Detection
from coreai_partitioner.cli.task import copy_beside
from coreai_partitioner.cli.text_encoders import TextEncoderPlan, bare_encoder, settle_text, write_tokenizer
from coreai_partitioner.cli.text_encoders import DEFAULTS, FLAGS, add_flags, tiny_config  # noqa: F401 - the text encoder tasks'
from coreai_partitioner.cli.text_encoders import after, check, describe, dry_run, eager, lower, reference  # noqa: F401 - their steps

NAME = "feature-extraction"
DETECT = Detection(
    takes="a sentence-transformers checkpoint: modules.json beside config.json", files=("modules.json",), refusal_hint=bare_encoder
)
MODEL = "AutoModel"
RUNNER = "an app's sentence embeddings (ExecuTorch's runtime)"


def tiny_configs() -> list[str]:
    from coreai_partitioner.text_encoder.tiny import NAMES

    return list(NAMES[NAME])


def refusals() -> tuple[type[Exception], ...]:
    from coreai_partitioner.text_encoder import UnsupportedSentenceModel, UnsupportedTextEncoder

    return UnsupportedTextEncoder, UnsupportedSentenceModel


def settle(args: argparse.Namespace, config: Any) -> TextEncoderPlan:
    """A sentence-transformers checkpoint whose modules and pooling are computed here (a tiny model's: mean, unit
    length), a model type a family adapts, the longest input."""
    from coreai_partitioner.text_encoder import read_sentence_config
    from coreai_partitioner.text_encoder.tiny import SENTENCE

    sentence = read_sentence_config(args.checkpoint) if args.checkpoint else SENTENCE
    return settle_text(NAME, args, config, sentence)


def companions(plan: TextEncoderPlan, directory: Path) -> list[Path]:
    """The tokenizer files, and the sentence-transformers files that say the pooling (a checkpoint's)."""
    from coreai_partitioner.text_encoder import sentence_files

    written = write_tokenizer(plan, directory)
    for relative in sentence_files(plan.args.checkpoint) if plan.args.checkpoint else []:
        (directory / relative).parent.mkdir(parents=True, exist_ok=True)
        written.append(copy_beside(plan.args.checkpoint / relative, (directory / relative).parent))
    return written
