"""Hugging Face audio-language models (audio and text in, text out) to one ``.pte`` for ExecuTorch's ``MultimodalRunner``.

Why a room of its own rather than a family of the image-text room: the
runner calls a different encoder (``audio_encoder`` over fp32 features
``[batch, bins, frames]``, not ``vision_encoder`` over pixels), a prompt's
audio is a run of windows where an image is one tile, what an app ports is a
feature extractor (a log-mel spectrogram), not an image resize, and a room's
name says what it holds.  What the two share, a text decoder fed embeddings
(``token_embedding``, ``text_decoder``, their device form, the methods
exported from one tree, the runner's calls), is written once in
:mod:`coreai_partitioner.text_decoder.multimodal`, before both.

The road of a checkpoint:

1. **Adapt** (:func:`adapt`, :mod:`.families`).  ``config.model_type``
   picks the family file (Voxtral); it composes the audio tower from
   :mod:`coreai_partitioner.blocks`' encoder layer over the model's own
   modules, takes the projector, and has the text model adapted by its own
   text-decoder family.  A checkpoint without an audio config, a type whose
   encoder or decoder is not lowered (named), a config value a family cannot
   honour, a window of more embeddings than one decoder call takes: all
   refused here, from the config, before any weights are read.
2. **Export and lower** (:func:`lower_audio_language`).  ``audio_encoder``
   (one window's features in, its embeddings out), ``token_embedding`` and
   ``text_decoder``, each one delegate of one shared Core AI asset; the
   runner's metadata as constant methods.
3. **Run** (:mod:`.run`): ExecuTorch's ``MultimodalRunner`` with a
   recording's windows, or the runner's calls in Python (:func:`.run.greedy`).

``python -m coreai_partitioner export --checkpoint DIR`` takes this road for
an ``audio-text-to-text`` checkpoint (:mod:`coreai_partitioner.cli.tasks.audio_text_to_text`).
"""

from coreai_partitioner import _compat  # noqa: F401 - first: it imports coreai-torch without coreai-torch's false version warning
from coreai_partitioner.audio_text_to_text.errors import AudioTokensOverBound, UnsupportedAudio, UnsupportedAudioConfig, UnsupportedAudioModel
from coreai_partitioner.audio_text_to_text.export import METHODS, adapt, check_config, export_methods, lower_audio_language, runner_metadata
from coreai_partitioner.audio_text_to_text.families import family_of, supported, tiny_config
from coreai_partitioner.audio_text_to_text.model import AudioLanguage

__all__ = [
    "METHODS",
    "AudioLanguage",
    "AudioTokensOverBound",
    "UnsupportedAudio",
    "UnsupportedAudioConfig",
    "UnsupportedAudioModel",
    "adapt",
    "check_config",
    "export_methods",
    "family_of",
    "lower_audio_language",
    "runner_metadata",
    "supported",
    "tiny_config",
]
