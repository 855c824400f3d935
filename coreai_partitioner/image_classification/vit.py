"""ViT and DeiT image classifiers over the Hugging Face model's own modules, for the checkpoint's image size.

Patch tokens (the patch convolution, the class token, DeiT's distillation
token, the position table added whole), then
:class:`~coreai_partitioner.blocks.EncoderLayer` layers (ViT is pre-norm:
``layernorm_before``, ``layernorm_after``; bidirectional SDPA composite),
the final LayerNorm, and the classifier on the class token's state
(DeiT with a teacher: the mean of the class and distillation heads).

transformers 5.0 keeps a layer's attention in ``attention.attention.query``...
and ``attention.output.dense`` and its MLP in ``intermediate`` / ``output``;
later releases in ``attention.q_proj``... ``o_proj`` and ``mlp.fc1`` /
``fc2``: :func:`encoder_layer` reads either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from coreai_partitioner.blocks import MLP, EncoderAttention, EncoderLayer

#: ``model_type`` -> the classes adapted, and where their heads read the encoder's states.
CLASSIFIERS = {
    "vit": {"ViTForImageClassification": {"classifier": 0}},
    "deit": {
        "DeiTForImageClassification": {"classifier": 0},
        "DeiTForImageClassificationWithTeacher": {"cls_classifier": 0, "distillation_classifier": 1},
    },
}


def image_size(config: Any) -> tuple[int, int]:
    """``(height, width)`` the checkpoint's position table is laid out for."""
    size = config.image_size
    return (size, size) if isinstance(size, int) else tuple(size)


class PatchTokens(nn.Module):
    """``pixels [B, C, H, W] -> [B, tokens, width]``: ``tokens`` (class, distillation) before the patches, plus
    the position table."""

    def __init__(self, conv: nn.Conv2d, tokens: Sequence[nn.Parameter], positions: nn.Parameter) -> None:
        super().__init__()
        self.conv = conv
        self.tokens = nn.ParameterList(tokens)
        self.positions = positions

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.conv(pixels.to(self.conv.weight.dtype)).flatten(2).transpose(1, 2)
        batch = patches.shape[0]
        tokens = [token.expand(batch, -1, -1) for token in self.tokens]
        return torch.cat([*tokens, patches], dim=1) + self.positions


def encoder_layer(layer: nn.Module, config: Any, path: str) -> EncoderLayer:
    """:class:`EncoderLayer` over a ViT / DeiT layer's own modules, in either transformers layout."""
    attn = layer.attention
    if hasattr(attn, "q_proj"):
        heads, head_dim = attn.num_attention_heads, attn.head_dim
        q, k, v, o = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
        fc1, fc2 = layer.mlp.fc1, layer.mlp.fc2
    else:
        heads, head_dim = attn.attention.num_attention_heads, attn.attention.attention_head_size
        q, k, v, o = attn.attention.query, attn.attention.key, attn.attention.value, attn.output.dense
        fc1, fc2 = layer.intermediate.dense, layer.output.dense
    attention = EncoderAttention(path, heads, head_dim, q=q, k=k, v=v, o=o, scale=head_dim**-0.5)
    return EncoderLayer(attention, MLP(config.hidden_act, fc1=fc1, fc2=fc2), norm1=layer.layernorm_before, norm2=layer.layernorm_after)


class ImageClassifier(nn.Module):
    """``pixel_values [B, C, H, W] -> logits [B, labels]``: patch tokens, the layers, the final norm, then the
    mean of each head over the state of its token."""

    def __init__(
        self, model_type: str, tokens: PatchTokens, layers: Sequence[EncoderLayer], norm: nn.Module, heads: dict[int, nn.Module]
    ) -> None:
        super().__init__()
        self.model_type = model_type
        self.tokens = tokens
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.heads = nn.ModuleList(heads.values())
        self.head_tokens = list(heads)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        hidden = self.tokens(pixel_values)
        for layer in self.layers:
            hidden = layer(hidden)
        hidden = self.norm(hidden)
        logits = [head(hidden[:, token]) for token, head in zip(self.head_tokens, self.heads)]
        return logits[0] if len(logits) == 1 else sum(logits) / len(logits)


def adapt(model: nn.Module) -> ImageClassifier:
    """:class:`ImageClassifier` over a ``ViTForImageClassification`` or ``DeiTForImageClassification[WithTeacher]``."""
    config = model.config
    heads = CLASSIFIERS[config.model_type][type(model).__name__]
    base = getattr(model, model.base_model_prefix)
    embeddings = base.embeddings
    tokens = [embeddings.cls_token] + ([embeddings.distillation_token] if hasattr(embeddings, "distillation_token") else [])
    hf_layers = base.layers if hasattr(base, "layers") else base.encoder.layer
    return ImageClassifier(
        config.model_type,
        PatchTokens(embeddings.patch_embeddings.projection, tokens, embeddings.position_embeddings),
        [encoder_layer(layer, config, f"layers.{i}") for i, layer in enumerate(hf_layers)],
        base.layernorm,
        {token: getattr(model, name) for name, token in heads.items()},
    )
