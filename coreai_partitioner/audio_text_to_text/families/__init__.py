"""One file per Hugging Face audio-language family, found by ``config.model_type``.

A family module defines:

- ``MODEL_TYPES``: the ``config.model_type`` values it adapts;
- ``build(model, shapes) -> AudioLanguage``: the audio tower, projector and
  text decoder over the model's own modules (the decoder is
  :func:`coreai_partitioner.text_decoder.adapt`'s, of the text model's own family);
- ``check(config, shapes)``: what the family refuses in a config, from the
  config alone (before any weights are loaded);
- ``prompt_ids(tokenizer, config, windows, text)``: the prompt of the audio then ``text``, as the processor makes it;
- ``window(config) -> (bins, frames)`` and ``audio_tokens(config)``: the
  features one ``audio_encoder`` call takes and how many embeddings it returns;
- ``tiny_config(model_type)`` and ``tiny_processor(config)``: a random
  2-layer model and the HF processor (or feature extractor and tokenizer) for it.

Modules whose name starts with ``_`` are not families.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from coreai_partitioner.audio_text_to_text.errors import UnsupportedAudioModel
from coreai_partitioner.text_decoder.families import family_modules

#: Audio-language families transformers ships that no file here adapts, and the part of each this package does not lower.
NOT_LOWERED = {
    "granite_speech": "its conformer encoder (Shaw relative-position attention, depthwise convolutions) and Q-Former projector",
    "audioflamingo3": "its audio encoder (AF-Whisper) and projector",
    "phi4_multimodal": "its conformer audio encoder and its LoRA-switched decoder",
    "gemma3n": "its USM conformer audio encoder and the per-layer embeddings of its decoder",
    "kyutai_speech_to_text": "its Mimi codec encoder (streaming audio tokens, not log-mel features)",
    "qwen2_5_omni": "its thinker-talker split and the talker's audio decoder",
    # Its decoder (Qwen2) is lowered; its encoder masks each recording's padding and returns as many embeddings as
    # the recording is long, a length the runner's audio input (features only) does not carry.
    "qwen2_audio": "length-masked encoder (as many embeddings as the recording is long, a length MultimodalRunner's audio input does not carry)",
}


@functools.cache
def registry() -> dict[str, ModuleType]:
    """``model_type`` -> its family module."""
    return family_modules(__path__, __name__)


def supported() -> tuple[str, ...]:
    """Every ``model_type`` some audio family adapts, sorted."""
    return tuple(sorted(registry()))


def family_of(config: Any) -> ModuleType:
    """The family module for an audio-language ``config`` (or its ``model_type``); refuses, from the config alone
    (before any weights are read), a config without an audio half and a type whose encoder or decoder is not lowered."""
    model_type = config if isinstance(config, str) else getattr(config, "model_type", None)
    family = registry().get(model_type)
    if family is not None:
        return family
    if model_type in NOT_LOWERED:
        raise UnsupportedAudioModel(
            f"{model_type}: an audio-language model whose {NOT_LOWERED[model_type]} this package does not lower; "
            f"audio-language families: {', '.join(supported())}"
        )
    if not isinstance(config, str) and getattr(config, "audio_config", None) is None:
        raise UnsupportedAudioModel(
            f"{model_type}: the checkpoint has no audio_config, so it is not an audio-language model; export it as "
            "its own task (python -m coreai_partitioner export --checkpoint DIR without --task)"
        )
    audio = getattr(getattr(config, "audio_config", None), "model_type", None)
    raise UnsupportedAudioModel(
        f"model_type {model_type!r}: no coreai_partitioner.audio_text_to_text family adapts it, so its audio encoder "
        f"({audio or 'unknown'}) is not lowered; audio-language families: {', '.join(supported())}"
    )


def tiny_config(model_type: str) -> Any:
    """The family's tiny random config for ``model_type``."""
    return family_of(model_type).tiny_config(model_type)
