"""Each BERT-class ``model_type`` read as :class:`~.model.TextEncoder` parts: its embeddings, layers, MLM head.

A family names where the Hugging Face model keeps its modules; the math is
:mod:`.model`'s and :class:`~coreai_partitioner.blocks.PostNormEncoderLayer`'s.
BERT and RoBERTa share their layer (``attention.self.query``...,
``attention.output.LayerNorm``, ``intermediate``, ``output``); RoBERTa
numbers positions from ``pad_token_id + 1`` and skips the padding (HF's
``create_position_ids_from_input_ids``), and its MLM head is ``lm_head``.
DistilBERT has no token types, its layer is ``q_lin``... ``sa_layer_norm``,
``ffn``, ``output_layer_norm``, and its head is four modules of the
``ForMaskedLM`` model itself.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from coreai_partitioner.blocks import MLP, EncoderAttention, PostNormEncoderLayer
from coreai_partitioner.blocks.mlp import ACTIVATIONS
from coreai_partitioner.text_encoder.errors import UnsupportedTextEncoder
from coreai_partitioner.text_encoder.model import TokenEmbeddings


def roberta_positions(ids: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """RoBERTa's position ids (HF's ``create_position_ids_from_input_ids``): each token's count of non-padding
    tokens up to it, from ``padding_idx + 1``; a padding token's is ``padding_idx``.

    The running count is a matmul with an upper-triangular matrix of ones, exact for counts below 2**24:
    the converter takes a matmul, and ``cumsum`` would stay outside the delegate, cutting it in three.
    """
    tokens = (ids != padding_idx).to(torch.float32)
    counted = torch.ones(ids.shape[1], ids.shape[1], device=ids.device).triu()  # [T, T]: token j counts toward each i >= j
    return ((tokens @ counted) * tokens + padding_idx).to(torch.int32)


class Bert:
    """BERT: ``bert.embeddings``, ``bert.encoder.layer``, the MLM head ``cls``."""

    model_type = "bert"
    activation_field = "hidden_act"

    def check(self, config: Any) -> None:
        """Refuse what the layers here do not compute, naming the field."""
        position = getattr(config, "position_embedding_type", "absolute") or "absolute"
        if position != "absolute":
            raise UnsupportedTextEncoder(
                f"{config.model_type}: position_embedding_type={position!r} adds relative position scores inside "
                "attention, which the SDPA composite does not take; only 'absolute' is exported"
            )
        if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
            raise UnsupportedTextEncoder(
                f"{config.model_type}: is_decoder / add_cross_attention make it a causal decoder; the text encoder "
                "path exports the bidirectional encoder: load it with is_decoder=False"
            )
        act = getattr(config, self.activation_field)
        if act not in ACTIVATIONS:
            raise UnsupportedTextEncoder(
                f"{config.model_type}: {self.activation_field}={act!r} is not one of {', '.join(ACTIVATIONS)}"
            )

    def max_tokens(self, config: Any) -> int:
        """The longest input the position table numbers."""
        return config.max_position_embeddings

    def embeddings(self, base: nn.Module) -> TokenEmbeddings:
        hf = base.embeddings
        return TokenEmbeddings(hf.word_embeddings, hf.position_embeddings, hf.LayerNorm, token_type=hf.token_type_embeddings)

    def hf_layers(self, base: nn.Module) -> list[nn.Module]:
        return list(base.encoder.layer)

    def layer(self, layer: nn.Module, config: Any, path: str) -> PostNormEncoderLayer:
        attn, out = layer.attention.self, layer.attention.output
        attention = EncoderAttention(
            path, attn.num_attention_heads, attn.attention_head_size,
            q=attn.query, k=attn.key, v=attn.value, o=out.dense, scale=attn.attention_head_size**-0.5,
        )
        mlp = MLP(config.hidden_act, fc1=layer.intermediate.dense, fc2=layer.output.dense)
        return PostNormEncoderLayer(attention, mlp, norm1=out.LayerNorm, norm2=layer.output.LayerNorm)

    def mlm_head(self, model: nn.Module) -> nn.Module:
        return model.cls


class Roberta(Bert):
    """RoBERTa: BERT's modules under ``roberta``, positions counted past the padding, the MLM head ``lm_head``."""

    model_type = "roberta"

    def max_tokens(self, config: Any) -> int:
        return config.max_position_embeddings - config.pad_token_id - 1

    def embeddings(self, base: nn.Module) -> TokenEmbeddings:
        hf = base.embeddings
        return TokenEmbeddings(
            hf.word_embeddings, hf.position_embeddings, hf.LayerNorm, token_type=hf.token_type_embeddings,
            positions=functools.partial(roberta_positions, padding_idx=hf.padding_idx),
        )

    def mlm_head(self, model: nn.Module) -> nn.Module:
        return model.lm_head


class DistilBert(Bert):
    """DistilBERT: ``distilbert.embeddings`` without token types, ``distilbert.transformer.layer``, a four-module head."""

    model_type = "distilbert"
    activation_field = "activation"

    def embeddings(self, base: nn.Module) -> TokenEmbeddings:
        hf = base.embeddings
        return TokenEmbeddings(hf.word_embeddings, hf.position_embeddings, hf.LayerNorm)

    def hf_layers(self, base: nn.Module) -> list[nn.Module]:
        return list(base.transformer.layer)

    def layer(self, layer: nn.Module, config: Any, path: str) -> PostNormEncoderLayer:
        attn = layer.attention
        head_dim = config.dim // config.n_heads
        attention = EncoderAttention(
            path, config.n_heads, head_dim, q=attn.q_lin, k=attn.k_lin, v=attn.v_lin, o=attn.out_lin, scale=head_dim**-0.5
        )
        mlp = MLP(config.activation, fc1=layer.ffn.lin1, fc2=layer.ffn.lin2)
        return PostNormEncoderLayer(attention, mlp, norm1=layer.sa_layer_norm, norm2=layer.output_layer_norm)

    def mlm_head(self, model: nn.Module) -> nn.Module:
        return nn.Sequential(model.vocab_transform, model.activation, model.vocab_layer_norm, model.vocab_projector)


FAMILIES = {family.model_type: family for family in (Bert(), Roberta(), DistilBert())}


def supported() -> list[str]:
    """The ``model_type`` values the text encoder path adapts."""
    return sorted(FAMILIES)


def family_of(config: Any) -> Bert:
    """The family of ``config.model_type``, its config checked; refused before any work if none adapts it."""
    family = FAMILIES.get(config.model_type)
    if family is None:
        raise UnsupportedTextEncoder(
            f"model_type {config.model_type!r} is not a text encoder this path adapts ({', '.join(supported())}); "
            "lower it whole with coreai_partitioner.lower(model, sample), which keeps no composites of its own"
        )
    family.check(config)
    return family
