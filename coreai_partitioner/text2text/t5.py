"""T5 and Flan-T5 as two methods: ``encoder`` once per input, ``text_decoder`` once per token, speech's conventions.

:func:`adapt` re-composes a Hugging Face ``T5ForConditionalGeneration`` over
its own modules and weights (nothing copied) into two modules, one per
method of the ``.pte``:

* :class:`T5Encoder`: ``encoder(input_ids [1, T] int64) -> cross``
  ``[1, 2 * layers * heads, T, head_dim]``, ``T`` from 1 to ``max_input_len``.
  The token embedding, pre-norm layers
  (:class:`~coreai_partitioner.blocks.EncoderLayer`: bidirectional
  attention with the relative position bias, :class:`BiasedEncoderAttention`;
  T5's RMS norms through the ``rms_norm`` composite; the MLP, relu or gated
  gelu), the final norm; then every decoder layer's cross-attention keys and
  values of the input (layer ``i``'s keys, then its values), as the speech
  encoder gives them.  The input is one sequence of exactly ``T`` tokens:
  nothing is padded, so nothing needs a padding mask.
* :class:`T5TextDecoder`: ``text_decoder(ids [1, 1] int64, cross,
  cache_position [1] int64) -> logits [1, 1, vocab]``: the token embedding,
  pre-norm layers (self-attention over a static cache with the causal
  relative position bias, :class:`BiasedSelfAttention`; attention to
  ``cross``, which T5 does without a bias; the MLP), the final norm, and the
  LM head, after the ``d_model ** -0.5`` rescale where the checkpoint ties
  it to the embedding.

Where T5 differs from Whisper, the differences are here and in
:mod:`.position_bias`: no ``1/sqrt(head_dim)`` in the scores (SDPA at
``scale=1.0``), the bias, RMS norms without mean or bias, the gated MLP, the
rescale.  What is the same (cross attention, the decoder layer, the split of
``encoder``'s output) is :mod:`coreai_partitioner.blocks.cross`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from coreai_partitioner.blocks import MLP, Attention, AttentionShape, EncoderAttention, EncoderLayer, GatedMLP, Step, norm
from coreai_partitioner.blocks.cross import CrossAttention, CrossDecoder, CrossDecoderLayer, CrossKeysValues, cross_of, decode_layers, output_logits
from coreai_partitioner.blocks.errors import UnsupportedConfig
from coreai_partitioner.blocks.mlp import ACTIVATIONS
from coreai_partitioner.text2text.position_bias import RelativePositionBias, attend_with_bias

#: The model types this room exports: T5 (original, relu) and T5 v1.1 / Flan-T5 (gated gelu) share ``t5``.
MODEL_TYPES = ("t5",)

#: T5's own length when its config names none (``n_positions`` of Google's checkpoints).
DEFAULT_POSITIONS = 512


class UnsupportedText2TextModel(ValueError):
    """A model this room does not export; names what it is and what it takes."""


class BiasedEncoderAttention(EncoderAttention):
    """The encoder's self-attention: every token attends every token, the relative position bias added to the
    scores (:func:`~.position_bias.attend_with_bias`); the SDPA composite at ``scale=1.0``."""

    def forward(self, x: torch.Tensor, bias: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """``bias``: the bias ``[1, heads, T, T]`` and the tokens' positions ``[T]``."""
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        out = attend_with_bias(self.sdpa, q, k, v, *bias)
        return self.o(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class BiasedSelfAttention(Attention):
    """The decoder's self-attention over its static cache, the causal relative position bias added to the scores.

    The bias is made once per call for every layer (the step memoizes it,
    as T5 shares its first layer's).  Its keys are the cache's slots, slot
    ``j`` holding position ``j``; a device step attends the cache and then
    the call's own rows (:class:`~coreai_partitioner.text_decoder.device.DeviceStep`),
    whose positions are the call's.
    """

    def __init__(self, path: str, shape: AttentionShape, bias: RelativePositionBias, **options) -> None:
        super().__init__(path, shape, scale=1.0, rope=None, **options)
        self.position_bias = bias

    def attend_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: Step) -> torch.Tensor:
        q = self.query(q, step)
        keys, values, mask = self.keys_values(k, v, step)
        bias = step.memoized(("position_bias", keys.shape[2]), lambda: self.bias(step, keys.shape[2]))
        out = attend_with_bias(self.sdpa, q, keys.to(q.dtype), values.to(q.dtype), bias, step.positions, mask)
        return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)

    def bias(self, step: Step, keys: int) -> torch.Tensor:
        slots = self.position_bias.first(self.key_cache.shape[2])
        positions = slots if keys == slots.shape[0] else torch.cat([slots, step.positions.float()])
        return self.position_bias(step.positions, positions)


class T5Encoder(nn.Module):
    """``encoder(input_ids [1, T]) -> cross [1, 2 * layers * heads, T, head_dim]`` (see the module)."""

    def __init__(
        self,
        *,
        embed: nn.Embedding,
        bias: RelativePositionBias,
        layers: list[EncoderLayer],
        norm: nn.Module,
        cross: list[CrossKeysValues],
    ) -> None:
        super().__init__()
        self.embed = embed
        self.position_bias = bias
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.cross = nn.ModuleList(cross)

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The encoder's last hidden state ``[1, T, d]`` (HF's ``last_hidden_state``)."""
        x = self.embed(input_ids)
        positions = self.position_bias.first(input_ids.shape[1])
        bias = (self.position_bias(positions, positions), positions)
        for layer in self.layers:
            x = layer(x, bias)
        return self.norm(x)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return cross_of(self.cross, self.hidden(input_ids))


class T5TextDecoder(CrossDecoder):
    """``text_decoder(ids [1, 1], cross, cache_position [1]) -> logits [1, 1, vocab]`` (see the module)."""

    def __init__(
        self,
        *,
        embed: nn.Embedding,
        layers: list[CrossDecoderLayer],
        norm: nn.Module,
        lm_head: nn.Linear,
        output_scale: float | None,
        max_decode_len: int,
    ) -> None:
        super().__init__(layers, norm, max_decode_len)
        self.embed = embed
        self.lm_head = lm_head
        #: ``d_model ** -0.5`` where the LM head is the tied embedding (HF's ``scale_decoder_outputs``), else ``None``.
        self.output_scale = output_scale

    def run(self, ids: torch.Tensor, positions: torch.Tensor, cross: torch.Tensor, step: Step) -> torch.Tensor:
        hidden = self.norm(decode_layers(self.layers, self.embed(ids), cross, step))
        if self.output_scale is not None:
            hidden = hidden * self.output_scale
        return output_logits(self.lm_head.weight, hidden)


@dataclass
class Text2Text:
    """The two modules a text2text ``.pte`` is made of, over one HF model's weights."""

    model_type: str
    encoder: T5Encoder
    decoder: T5TextDecoder
    max_input_len: int  # the longest input encoder takes
    cross_heads: int  # 2 * layers * heads: dim 1 of encoder's output
    head_dim: int


def positions_of(config) -> int:
    """T5's own length: ``n_positions`` where the config names it, else 512 (its pretraining inputs)."""
    return int(getattr(config, "n_positions", None) or DEFAULT_POSITIONS)


def check_model(model: nn.Module) -> None:
    """Refuse, naming it, a model this room does not export (before any work)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        raise UnsupportedText2TextModel(
            f"{type(model).__name__} ({model_type}): the text2text export takes a T5ForConditionalGeneration "
            f"(t5: T5, T5 v1.1, Flan-T5); {model_type} is not adapted here (mt5, umt5, longt5 and bart differ in "
            "their attention, norms or vocabulary)"
        )
    if not all(hasattr(model, name) for name in ("encoder", "decoder", "lm_head")):
        raise UnsupportedText2TextModel(
            f"{type(model).__name__}: no encoder, decoder and LM head; export a T5ForConditionalGeneration "
            "(AutoModelForSeq2SeqLM)"
        )
    if config.dense_act_fn not in ACTIVATIONS:
        takes = f"relu, gated-gelu or an activation of {', '.join(ACTIVATIONS)}"
        raise UnsupportedConfig("feed_forward_proj", config.feed_forward_proj, takes, model_type)


def output_scale(model: nn.Module) -> float | None:
    """``d_model ** -0.5`` where HF rescales the decoder's output before the LM head, else ``None``."""
    config = model.config
    scaled = getattr(config, "scale_decoder_outputs", config.tie_word_embeddings)  # transformers 5.24, 5.0
    return config.d_model ** -0.5 if scaled else None


def adapt(model: nn.Module, max_decode_len: int | None = None, max_input_len: int | None = None) -> Text2Text:
    """:class:`Text2Text` over ``model``'s own modules: ``max_decode_len`` self-attention cache slots and inputs of
    at most ``max_input_len`` tokens (both 512 by default, T5's own length, ``n_positions``)."""
    check_model(model)
    config = model.config
    max_decode_len = positions_of(config) if max_decode_len is None else max_decode_len
    max_input_len = positions_of(config) if max_input_len is None else max_input_len
    for field, value in (("max_decode_len", max_decode_len), ("max_input_len", max_input_len)):
        if value < 1:
            raise UnsupportedConfig(field, value, "at least 1", config.model_type)
    encoder, decoder = model.encoder, model.decoder
    heads, head_dim = config.num_heads, config.d_kv
    dtype = decoder.embed_tokens.weight.dtype

    def mlp(hf: nn.Module) -> nn.Module:
        dense = hf.layer[-1].DenseReluDense
        if config.is_gated_act:
            return GatedMLP(config.dense_act_fn, gate=dense.wi_0, up=dense.wi_1, down=dense.wo)
        return MLP(config.dense_act_fn, fc1=dense.wi, fc2=dense.wo)

    def encoder_layer(i: int, hf: nn.Module) -> EncoderLayer:
        a = hf.layer[0].SelfAttention
        attention = BiasedEncoderAttention(
            f"encoder.block.{i}.layer.0.SelfAttention", heads, head_dim, q=a.q, k=a.k, v=a.v, o=a.o, scale=1.0
        )
        return EncoderLayer(attention, mlp(hf), norm1=norm(hf.layer[0].layer_norm), norm2=norm(hf.layer[-1].layer_norm))

    self_bias = RelativePositionBias.of(decoder.block[0].layer[0].SelfAttention, max_decode_len, bidirectional=False)
    layers, crosses = [], []
    for i, hf in enumerate(decoder.block):
        a, c = hf.layer[0].SelfAttention, hf.layer[1].EncDecAttention
        attention = BiasedSelfAttention(
            f"decoder.block.{i}.layer.0.SelfAttention", AttentionShape(heads, heads, head_dim), self_bias,
            q=a.q, k=a.k, v=a.v, o=a.o, context=max_decode_len, dtype=dtype,
        )
        cross = CrossAttention(f"decoder.block.{i}.layer.1.EncDecAttention", heads, head_dim, q=c.q, o=c.o, scale=1.0)
        crosses.append(CrossKeysValues(heads, head_dim, k=c.k, v=c.v))
        layers.append(CrossDecoderLayer(attention, cross, mlp(hf), norm1=norm(hf.layer[0].layer_norm),
                                        norm2=norm(hf.layer[1].layer_norm), norm3=norm(hf.layer[-1].layer_norm)))
    t5_encoder = T5Encoder(
        embed=encoder.embed_tokens,
        bias=RelativePositionBias.of(encoder.block[0].layer[0].SelfAttention, max_input_len, bidirectional=True),
        layers=[encoder_layer(i, hf) for i, hf in enumerate(encoder.block)],
        norm=norm(encoder.final_layer_norm),
        cross=crosses,
    ).eval()
    t5_decoder = T5TextDecoder(
        embed=decoder.embed_tokens, layers=layers, norm=norm(decoder.final_layer_norm), lm_head=model.lm_head,
        output_scale=output_scale(model), max_decode_len=max_decode_len,
    ).eval()
    return Text2Text(config.model_type, t5_encoder, t5_decoder, max_input_len, 2 * len(layers) * heads, head_dim)
