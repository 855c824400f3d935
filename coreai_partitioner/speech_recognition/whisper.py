"""Whisper as ExecuTorch's ASR runner calls it: ``encoder`` once per utterance, ``text_decoder`` once per token.

:func:`adapt` re-composes a Hugging Face ``WhisperForConditionalGeneration``
over its own modules and weights (nothing copied) into two modules, one per
method of the ``.pte``:

* :class:`SpeechEncoder`: ``encoder(features [1, n_mels, 3000] fp32) -> cross``.
  The two convolutions (GELU), the sinusoidal positions, the pre-norm layers
  (:class:`~coreai_partitioner.blocks.EncoderLayer`: bidirectional SDPA,
  HF's LayerNorms, which coreai-torch converts to ``layer_norm``), the final
  LayerNorm; then every decoder layer's cross-attention keys and values of
  the utterance, ``cross`` ``[1, 2 * layers * heads, frames, head_dim]``
  (layer ``i``'s keys, then its values, as heads).
* :class:`TextDecoder`: ``text_decoder(ids [1, 1] int64, cross, cache_position
  [1] int64) -> logits [1, 1, vocab]``.  The token and position embeddings,
  pre-norm layers (self-attention over a static cache,
  :class:`~coreai_partitioner.blocks.Attention` without RoPE; attention to
  ``cross`` through the SDPA composite, :class:`~coreai_partitioner.blocks.cross.CrossAttention`;
  the MLP: :class:`~coreai_partitioner.blocks.cross.CrossDecoderLayer`),
  the final LayerNorm and the output projection, which is the token
  embedding (tied: one copy).

Why the cross-attention keys and values come out of ``encoder``: they are a
function of the utterance alone, so the method that runs once per utterance
computes them, as ``[1500, d] x [d, 2d]`` products beside the encoder's own.
The runner holds the encoder's one output and passes it to every
``text_decoder`` call (ExecuTorch's ASR runner does exactly that), so the
decoder needs no branch (``torch.cond`` on the first position) and no cross
cache of its own: nothing of the cross attention is state, nothing depends on
a buffer's initial value, and a new utterance needs no reset; the host and
device forms differ only in the self-attention caches.  The price: the
encoder's output is ``2 * layers`` times the size of its hidden states (37 MB
for Whisper base in fp32), which every ``text_decoder`` call takes as an
input (both runtimes pass it without a copy; the program cuts it into each
layer's keys and values outside the delegate, a memcpy, where Core AI on
Linux copied each slice element by element: :func:`~coreai_partitioner.blocks.cross.split_cross`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn

from coreai_partitioner.blocks import MLP, Attention, AttentionShape, EncoderAttention, EncoderLayer, Step
from coreai_partitioner.blocks.cross import CrossAttention, CrossDecoder, CrossDecoderLayer, CrossKeysValues, cross_of, decode_layers, output_logits
from coreai_partitioner.blocks.errors import UnsupportedConfig

#: The mel frames of one 30 s window, what ``encoder`` takes (the ASR runner's ``[1, n_mels, 3000]``).
FRAMES = 3000


class UnsupportedSpeechModel(ValueError):
    """A model this room does not export; names what it is and what it takes."""


class SpeechEncoder(nn.Module):
    """``encoder(features [1, n_mels, 3000]) -> cross [1, 2 * layers * heads, frames, head_dim]`` (see the module)."""

    def __init__(
        self,
        *,
        conv1: nn.Module,
        conv2: nn.Module,
        positions: nn.Parameter,
        layers: list[EncoderLayer],
        norm: nn.Module,
        cross: list[CrossKeysValues],
        cross_dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2
        #: The output's dtype: ``text_decoder``'s, which the encoder may compute wider (:func:`at_precision`).
        self.cross_dtype = cross_dtype
        self.positions = positions
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.cross = nn.ModuleList(cross)

    def hidden(self, features: torch.Tensor) -> torch.Tensor:
        """The encoder's last hidden state ``[1, frames, d]`` (HF's ``last_hidden_state``)."""
        x = features.to(self.positions.dtype)  # the runner passes fp32 features whatever the model's dtype
        x = nn.functional.gelu(self.conv1(x))
        x = nn.functional.gelu(self.conv2(x))
        x = x.permute(0, 2, 1) + self.positions
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return cross_of(self.cross, self.hidden(features), self.cross_dtype)


class TextDecoder(CrossDecoder):
    """``text_decoder(ids [1, 1], cross, cache_position [1]) -> logits [1, 1, vocab]``, one token a call (see the
    module): the token and position embeddings, the layers, the tied output projection."""

    def __init__(
        self,
        *,
        embed: nn.Embedding,
        positions: nn.Parameter,
        layers: list[CrossDecoderLayer],
        norm: nn.Module,
        max_decode_len: int,
    ) -> None:
        super().__init__(layers, norm, max_decode_len)
        self.embed = embed
        self.positions = positions

    def run(self, ids: torch.Tensor, positions: torch.Tensor, cross: torch.Tensor, step: Step) -> torch.Tensor:
        """The logits of ``ids`` [1, T] at ``positions`` (indices into the position table), caches the ``step``'s way."""
        hidden = decode_layers(self.layers, self.embed(ids) + self.positions[positions].unsqueeze(0), cross, step)
        return output_logits(self.embed.weight, self.norm(hidden))  # the token embedding: tied, one copy


@dataclass
class Speech:
    """The two modules a speech ``.pte`` is made of, over one HF model's weights."""

    model_type: str
    encoder: SpeechEncoder
    decoder: TextDecoder
    n_mels: int
    frames: int  # the encoder's output frames (max_source_positions)
    cross_shape: tuple[int, int, int, int]  # [1, 2 * layers * heads, frames, head_dim]


def check_model(model: nn.Module) -> None:
    """Refuse, naming it, a model this room does not export (before any work)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type != "whisper" or not hasattr(model, "model") or not hasattr(model.model, "encoder"):
        raise UnsupportedSpeechModel(
            f"{type(model).__name__} ({model_type}): the speech export takes a WhisperForConditionalGeneration "
            "(automatic-speech-recognition); export a text decoder with `python -m coreai_partitioner export-llm`"
        )
    if getattr(config, "scale_embedding", False):
        raise UnsupportedConfig("scale_embedding", True, "False (Whisper's own)", model_type)
    stride = model.model.encoder.conv1.stride[0] * model.model.encoder.conv2.stride[0]
    if config.max_source_positions * stride != FRAMES:
        raise UnsupportedConfig(
            "max_source_positions", config.max_source_positions, f"{FRAMES // stride} (a 30 s window of {FRAMES} mel frames)", model_type
        )


def encoder_side(model: nn.Module) -> list[nn.Module]:
    """The modules of a Whisper whose work ``encoder`` does: Hugging Face's encoder, and each decoder layer's
    cross-attention key and value projections (:class:`CrossKeysValues`)."""
    layers = model.model.decoder.layers
    return [model.model.encoder] + [p for layer in layers for p in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj)]


def at_precision(model: nn.Module, dtype: torch.dtype, *, encoder_dtype: torch.dtype | None = None) -> nn.Module:
    """``model``, in place, at ``dtype``, with what runs in ``encoder`` (:func:`encoder_side`) at ``encoder_dtype``.

    An encoder wider than the decoder (``fp32`` under an ``fp16`` decoder)
    runs once per utterance; the decoder, once per token, keeps the narrow
    dtype.  Cast from the weights as loaded: load at the wider dtype.  The
    key and value projections' outputs are cast to the decoder's dtype
    (a forward hook), so Hugging Face's own ``forward`` and ``generate`` run
    the model as the ``.pte`` does, its cross-attention keys and values
    rounded once to the decoder's dtype (:attr:`SpeechEncoder.cross_dtype`).
    """
    check_model(model)
    encoder_dtype = dtype if encoder_dtype is None else encoder_dtype
    kept = encoder_side(model)
    _cast_around(model, dtype, set(kept))
    for module in kept:
        module.to(encoder_dtype)
    for projection in kept[1:]:
        if projection in _cross_casts:  # a model cast again: its former decoder dtype no longer holds
            _cross_casts.pop(projection).remove()
        if encoder_dtype != dtype:
            _cross_casts[projection] = projection.register_forward_hook(lambda module, inputs, output: output.to(dtype))
    return model


#: The forward hooks :func:`at_precision` put on key and value projections, to take off when it casts again.
_cross_casts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cast_around(module: nn.Module, dtype: torch.dtype, kept: set[nn.Module]) -> None:
    """Every parameter and buffer of ``module`` at ``dtype`` but those of the modules in ``kept``."""
    if module in kept:
        return
    if not any(inner in kept for inner in module.modules()):
        module.to(dtype)
        return
    own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
    if own:
        raise UnsupportedSpeechModel(
            f"{type(module).__name__} holds its own tensors beside modules kept at another dtype; "
            "export it at one dtype (leave --encoder-dtype out)"
        )
    for child in module.children():
        _cast_around(child, dtype, kept)


def adapt(model: nn.Module, max_decode_len: int | None = None) -> Speech:
    """:class:`Speech` over ``model``'s own modules; ``max_decode_len`` slots of self-attention cache
    (at most, and by default, ``config.max_target_positions``)."""
    check_model(model)
    config = model.config
    limit = config.max_target_positions
    max_decode_len = limit if max_decode_len is None else max_decode_len
    if not 1 <= max_decode_len <= limit:
        raise UnsupportedConfig(
            "max_target_positions", limit, f"a decode length from 1 to {limit} (got {max_decode_len})", config.model_type
        )
    encoder, decoder = model.model.encoder, model.model.decoder
    dtype = decoder.embed_tokens.weight.dtype

    def encoder_layer(i: int, hf: nn.Module) -> EncoderLayer:
        a = hf.self_attn
        attention = EncoderAttention(
            f"encoder.layers.{i}.self_attn", a.num_heads, a.head_dim, q=a.q_proj, k=a.k_proj, v=a.v_proj, o=a.out_proj,
            scale=a.scaling,
        )
        return EncoderLayer(attention, MLP(config.activation_function, fc1=hf.fc1, fc2=hf.fc2),
                            norm1=hf.self_attn_layer_norm, norm2=hf.final_layer_norm)

    layers, crosses = [], []
    for i, hf in enumerate(decoder.layers):
        a, c = hf.self_attn, hf.encoder_attn
        attention = Attention(
            f"decoder.layers.{i}.self_attn", AttentionShape(a.num_heads, a.num_heads, a.head_dim),
            q=a.q_proj, k=a.k_proj, v=a.v_proj, o=a.out_proj, context=max_decode_len, dtype=dtype, scale=a.scaling, rope=None,
        )
        cross = CrossAttention(f"decoder.layers.{i}.encoder_attn", c.num_heads, c.head_dim, q=c.q_proj, o=c.out_proj, scale=c.scaling)
        crosses.append(CrossKeysValues(c.num_heads, c.head_dim, k=c.k_proj, v=c.v_proj))
        mlp = MLP(config.activation_function, fc1=hf.fc1, fc2=hf.fc2)
        layers.append(CrossDecoderLayer(attention, cross, mlp, norm1=hf.self_attn_layer_norm, norm2=hf.encoder_attn_layer_norm,
                                   norm3=hf.final_layer_norm))
    speech_encoder = SpeechEncoder(
        conv1=encoder.conv1, conv2=encoder.conv2, positions=encoder.embed_positions.weight,
        layers=[encoder_layer(i, hf) for i, hf in enumerate(encoder.layers)], norm=encoder.layer_norm, cross=crosses,
        cross_dtype=dtype,
    ).eval()
    text_decoder = TextDecoder(
        embed=decoder.embed_tokens, positions=decoder.embed_positions.weight, layers=layers, norm=decoder.layer_norm,
        max_decode_len=max_decode_len,
    ).eval()
    heads, head_dim = crosses[0].heads, crosses[0].head_dim
    frames = config.max_source_positions
    return Speech(
        config.model_type, speech_encoder, text_decoder, config.num_mel_bins, frames,
        (1, 2 * len(layers) * heads, frames, head_dim),
    )
