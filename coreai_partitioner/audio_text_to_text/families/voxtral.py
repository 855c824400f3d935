"""Voxtral: a Whisper-style encoder, four frames stacked into an MLP projector, a Llama (Mistral) decoder.

The encoder is Whisper's (Hugging Face's ``VoxtralEncoder``): two
convolutions with GELU over one 30 s window of 128-bin log-mel features
``[1, 128, 3000]``, the learned positions, pre-norm layers
(:class:`~coreai_partitioner.blocks.EncoderLayer`: bidirectional SDPA, HF's
LayerNorms) and the final LayerNorm: ``[1, 1500, d]``.  ``get_audio_features``
reshapes that to ``[375, 4 d]`` (four consecutive frames side by side:
``audio_config.intermediate_size`` is ``4 d``) and the projector (Linear,
GELU, Linear) makes 375 embeddings of the decoder's width a window.

The processor (``VoxtralProcessor``) pads a recording to a whole number of
30 s windows, computes one spectrogram over all of it (Whisper's, its
floor at 8 below the whole recording's maximum) and cuts it into windows,
stacked along the batch; the model concatenates the windows' embeddings in
order, where the prompt holds ``[AUDIO]`` (id 24) 375 times a window.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coreai_partitioner.audio_text_to_text.errors import UnsupportedAudioConfig
from coreai_partitioner.audio_text_to_text.model import AudioLanguage
from coreai_partitioner.blocks import MLP, EncoderAttention, EncoderLayer

MODEL_TYPES = ("voxtral",)

#: The mel frames of one 30 s window (what the encoder's convolutions take: twice its positions).
FRAMES = 3000
#: How many encoder frames one embedding stacks (``intermediate_size / hidden_size`` of the audio config).
STACKED = 4
#: The processor's audio placeholder (``VoxtralProcessor.audio_token_id``).
AUDIO_TOKEN_ID = 24


class WhisperTower(nn.Module):
    """``[1, bins, 3000]`` -> ``[1, 1500, d]``: Voxtral's (Whisper's) encoder over its own modules."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.conv1, self.conv2 = encoder.conv1, encoder.conv2
        self.positions = encoder.embed_positions.weight
        act = encoder.config.activation_function
        self.layers = nn.ModuleList(encoder_layer(i, layer, act) for i, layer in enumerate(encoder.layers))
        self.norm = encoder.layer_norm

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = features.to(self.conv1.weight.dtype)  # the runner passes fp32 features whatever the model's dtype
        x = nn.functional.gelu(self.conv1(x))
        x = nn.functional.gelu(self.conv2(x))
        x = (x.permute(0, 2, 1) + self.positions).to(x.dtype)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def encoder_layer(index: int, layer: nn.Module, act: str) -> EncoderLayer:
    a = layer.self_attn
    attention = EncoderAttention(
        f"audio_tower.layers.{index}.self_attn", a.num_heads, a.head_dim, q=a.q_proj, k=a.k_proj, v=a.v_proj,
        o=a.out_proj, scale=a.scaling,
    )
    mlp = MLP(act, fc1=layer.fc1, fc2=layer.fc2)
    return EncoderLayer(attention, mlp, norm1=layer.self_attn_layer_norm, norm2=layer.final_layer_norm)


class StackedProjector(nn.Module):
    """``[1, frames, d]`` -> ``[1, frames / 4, D]``: four frames side by side, then HF's projector."""

    def __init__(self, projector: nn.Module, stacked_width: int) -> None:
        super().__init__()
        self.projector = projector
        self.stacked_width = stacked_width

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.projector(hidden.reshape(hidden.shape[0], -1, self.stacked_width))


def window(config: Any) -> tuple[int, int]:
    return config.audio_config.num_mel_bins, FRAMES


def audio_tokens(config: Any) -> int:
    audio = config.audio_config
    return audio.max_source_positions * audio.hidden_size // audio.intermediate_size


def check(config: Any, shapes: Any) -> None:
    """The stacking Voxtral's ``get_audio_features`` does and the window its encoder takes."""
    audio = config.audio_config
    if audio.intermediate_size != STACKED * audio.hidden_size:
        raise UnsupportedAudioConfig(
            config.model_type, "audio_config.intermediate_size", audio.intermediate_size,
            f"{STACKED} x audio_config.hidden_size ({STACKED * audio.hidden_size}): the projector takes {STACKED} frames stacked",
        )
    if audio.max_source_positions * 2 != FRAMES:
        raise UnsupportedAudioConfig(
            config.model_type, "audio_config.max_source_positions", audio.max_source_positions,
            f"{FRAMES // 2} (a 30 s window of {FRAMES} mel frames)",
        )
    if getattr(audio, "scale_embedding", False):
        raise UnsupportedAudioConfig(config.model_type, "audio_config.scale_embedding", True, "False (Voxtral's own)")


def build(model: nn.Module, shapes: Any) -> AudioLanguage:
    from coreai_partitioner.text_decoder import adapt
    from coreai_partitioner.text_decoder.multimodal import TextModel

    config = model.config
    base = model.model if hasattr(getattr(model, "model", None), "audio_tower") else model
    language = base.language_model
    if hasattr(language, "lm_head"):  # transformers 5.0.0rc1 (optimum-executorch's pin): a causal LM of its own
        text = TextModel(config.get_text_config(), language.model, language.lm_head)
    else:
        text = TextModel(config.get_text_config(), language, model.lm_head)
    bins, frames = window(config)
    return AudioLanguage(
        model_type=config.model_type,
        tower=WhisperTower(base.audio_tower),
        projector=StackedProjector(base.multi_modal_projector, config.audio_config.intermediate_size),
        decoder=adapt(text, shapes),
        bins=bins,
        frames=frames,
        audio_tokens=audio_tokens(config),
        audio_token_id=config.audio_token_id,
    ).eval()


def tiny_config(model_type: str) -> Any:
    """Voxtral of a 2-layer, 16-wide encoder over Voxtral's own 128-bin 30 s window and a 2-layer Llama decoder."""
    from transformers import VoxtralConfig, VoxtralEncoderConfig

    from coreai_partitioner.text_decoder import first_layers, tiny_config as text_tiny

    text = first_layers(text_tiny("llama"), 2)
    text.max_position_embeddings = 1024  # two 30 s windows (750 embeddings) and a prompt
    audio = VoxtralEncoderConfig(
        hidden_size=16, intermediate_size=STACKED * 16, num_hidden_layers=2, num_attention_heads=2, num_mel_bins=128,
        max_source_positions=FRAMES // 2,
    )
    return VoxtralConfig(audio_config=audio.to_dict(), text_config=text.to_dict(), audio_token_id=AUDIO_TOKEN_ID)


def tiny_processor(config: Any) -> Any:
    """Voxtral's feature extractor (Whisper's, 128 bins) and a one-character tokenizer whose id 24 is ``[AUDIO]``."""
    from transformers import WhisperFeatureExtractor

    from coreai_partitioner.text_decoder.multimodal import tiny_tokenizer

    special = {AUDIO_TOKEN_ID: "[AUDIO]", AUDIO_TOKEN_ID + 1: "[BEGIN_AUDIO]", 3: "[INST]", 4: "[/INST]"}
    return WhisperFeatureExtractor(feature_size=config.audio_config.num_mel_bins), tiny_tokenizer(config, special)


def prompt_ids(tokenizer: Any, config: Any, windows: int, text: str) -> list[int]:
    """Voxtral's chat prompt of one user turn, the audio then ``text``: ``<s>[INST][BEGIN_AUDIO]`` then ``[AUDIO]``
    375 times a window, the text, ``[/INST]`` (what mistral-common's ``apply_chat_template`` makes of it)."""
    special = tokenizer.convert_tokens_to_ids(["[INST]", "[BEGIN_AUDIO]", "[/INST]"])
    if any(i is None or i == tokenizer.unk_token_id for i in special):
        raise UnsupportedAudioConfig(
            config.model_type, "tokenizer", "without [INST], [BEGIN_AUDIO] and [/INST]", "Voxtral's tokenizer (tekken's special tokens)"
        )
    inst, begin, end = special
    bos = config.get_text_config().bos_token_id
    audio = [config.audio_token_id] * (audio_tokens(config) * windows)
    return [bos, inst, begin, *audio, *tokenizer(text, add_special_tokens=False)["input_ids"], end]
