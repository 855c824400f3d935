"""A text encoder's ``.pte`` against the Hugging Face model it was lowered from: what ``export --verify`` feeds it.

:func:`sample` is a seeded random text, its last quarter padding, so the
padding mask counts; :func:`task_forward` is the Hugging Face eager model
computing the task: ``fill-mask`` its ``logits``, ``feature-extraction`` its
``last_hidden_state`` pooled as the checkpoint's sentence-transformers
modules pool it (:class:`~.pooling.Pooling`, which the tests hold to
sentence-transformers' own).  The judging is
:mod:`coreai_partitioner.verify.forward`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from coreai_partitioner.text_encoder.pooling import Pooling, SentenceConfig

#: The most tokens the verify text has.
TOKENS = 16


def sample(config: Any, max_seq_len: int, *, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [1, T], attention_mask [1, T])``: ``T`` up to :data:`TOKENS`, ids drawn above the padding id,
    the last quarter padding (the padding id, mask 0)."""
    length = min(TOKENS, max_seq_len)
    pad = getattr(config, "pad_token_id", None) or 0
    ids = torch.randint(pad + 1, config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    padding = length // 4
    if padding:
        ids[:, -padding:], mask[:, -padding:] = pad, 0
    return ids, mask


def task_forward(model: nn.Module, task: str, sentence: SentenceConfig | None = None) -> Callable[..., torch.Tensor]:
    """``(input_ids, attention_mask) -> output`` of Hugging Face's eager ``model`` for ``task``: the logits of a
    ``...ForMaskedLM``, or the encoder's states pooled as ``sentence`` says."""
    if task == "fill-mask":
        return lambda ids, mask: model(input_ids=ids, attention_mask=mask).logits
    pooling = Pooling(sentence)
    return lambda ids, mask: pooling(model(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
