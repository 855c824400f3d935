"""A BERT-class encoder over the Hugging Face model's own modules, and its two heads.

:class:`TokenEmbeddings` adds a token's word, position and (first) token-type
embeddings and normalizes them; :class:`TextEncoder` runs the
:class:`~coreai_partitioner.blocks.PostNormEncoderLayer` stack with the
padding mask built from ``attention_mask``.  :class:`MaskedLM` ends in the
checkpoint's MLM head (the logits of every position), :class:`SentenceEmbedding`
in the pooling a sentence-transformers checkpoint describes (:mod:`.pooling`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from coreai_partitioner.blocks import PostNormEncoderLayer


class TokenEmbeddings(nn.Module):
    """``norm(word[ids] + token_type[0] + position[positions])``, ``[B, T] -> [B, T, width]``.

    ``positions(ids)`` gives each token's position id; ``None`` is the first
    ``T`` rows of the table in order (BERT, DistilBERT), which reach the graph
    as a slice of the table rather than as integer ids; other ids look the
    table up without its ``padding_idx``, which only training reads (an
    embedding with one stays outside the delegate).  ``token_type`` is
    ``None`` where the model has none (DistilBERT); a call passes no token
    types, so every token has the first, as HF's default.
    """

    def __init__(
        self,
        word: nn.Embedding,
        position: nn.Embedding,
        norm: nn.Module,
        *,
        token_type: nn.Embedding | None = None,
        positions: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.word, self.position, self.norm, self.token_type = word, position, norm, token_type
        self.positions = positions

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.word(ids)
        if self.token_type is not None:
            hidden = hidden + self.token_type.weight[0]
        if self.positions is None:
            hidden = hidden + self.position.weight[: ids.shape[1]]
        else:
            hidden = hidden + nn.functional.embedding(self.positions(ids), self.position.weight)
        return self.norm(hidden)


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` (1: a token, 0: padding) as the SDPA mask ``[B, 1, T, T]``: every token attends the tokens, none the padding."""
    batch, length = attention_mask.shape
    return (attention_mask != 0)[:, None, None, :].expand(batch, 1, length, length)


class TextEncoder(nn.Module):
    """``(input_ids [B, T], attention_mask [B, T]) -> [B, T, width]``: the embeddings, then the layers, padding masked."""

    def __init__(self, model_type: str, embeddings: TokenEmbeddings, layers: Sequence[PostNormEncoderLayer]) -> None:
        super().__init__()
        self.model_type = model_type
        self.embeddings = embeddings
        self.layers = nn.ModuleList(layers)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.embeddings(input_ids)
        mask = padding_mask(attention_mask)
        for layer in self.layers:
            hidden = layer(hidden, mask)
        return hidden


class MaskedLM(nn.Module):
    """``fill-mask``: ``(input_ids, attention_mask) -> logits [B, T, vocab]``, the checkpoint's MLM head over every position."""

    def __init__(self, encoder: TextEncoder, head: nn.Module) -> None:
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(input_ids, attention_mask))


class SentenceEmbedding(nn.Module):
    """``feature-extraction``: ``(input_ids, attention_mask) -> [B, width]``, the encoder's states pooled (:mod:`.pooling`)."""

    def __init__(self, encoder: TextEncoder, pooling: nn.Module) -> None:
        super().__init__()
        self.encoder, self.pooling = encoder, pooling

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.pooling(self.encoder(input_ids, attention_mask), attention_mask)
