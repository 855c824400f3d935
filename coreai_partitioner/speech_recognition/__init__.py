"""Speech recognition: Whisper to one ``.pte`` in ExecuTorch's ASR runner conventions, with Core AI composites.

The road of a checkpoint (``python -m coreai_partitioner export --checkpoint DIR`` for an
``automatic-speech-recognition`` one, :mod:`coreai_partitioner.cli.tasks.automatic_speech_recognition`):

1. **Adapt** (:func:`adapt`, :mod:`.whisper`).  The Hugging Face model's own
   modules re-composed from :mod:`coreai_partitioner.blocks` into the two
   methods the ASR runner calls: ``encoder(features) -> cross`` (the encoder
   and every decoder layer's cross-attention keys and values, once per
   utterance) and ``text_decoder(ids, cross, cache_position) -> logits``
   (one token a call over static self-attention caches).
2. **Export and lower** (:func:`lower_speech`, :mod:`.export`).  Both methods
   exported with their composites externalized (SDPA, ``layer_norm``) and
   lowered in one call to one Core AI asset, a function each, each weight
   stored once; the host form keeps the caches as Core AI state, the device
   form (:mod:`.device`) as ExecuTorch's buffers, for upstream's on-device runtime.
   :func:`at_precision` may compute the encoder wider than the decoder
   (fp32 under fp16): it runs once per utterance, the decoder once per token.
3. **Features** (:mod:`.features`).  A 16 kHz mono wav as Whisper's log-mel,
   as ``WhisperFeatureExtractor`` computes it; bad recordings refused first.
4. **Transcribe** (:class:`SpeechProgram`, :mod:`.transcribe`).  The ``.pte``
   in ExecuTorch's runtime, the loop an app runs, with Hugging Face's greedy
   rules for Whisper (:class:`DecodingRules`).
5. **Verify** (:mod:`.check`): the encoder's output, the first logits and the
   greedy ids against Hugging Face eager.
"""

from coreai_partitioner import _compat  # noqa: F401 - first: it imports coreai-torch without its false version warning
from coreai_partitioner.speech_recognition.export import METHODS, TARGETS, lower_speech, runner_metadata
from coreai_partitioner.speech_recognition.features import AudioError, FeatureSettings, log_mel, log_mel_windows, mel_filters, read_wav
from coreai_partitioner.speech_recognition.transcribe import (
    Decoded,
    DecodingError,
    DecodingRules,
    SpeechProgram,
    decode,
    normalized_words,
    word_error_rate,
)
from coreai_partitioner.speech_recognition.whisper import FRAMES, Speech, UnsupportedSpeechModel, adapt, at_precision

__all__ = [
    "FRAMES",
    "METHODS",
    "TARGETS",
    "AudioError",
    "Decoded",
    "DecodingError",
    "DecodingRules",
    "FeatureSettings",
    "Speech",
    "SpeechProgram",
    "UnsupportedSpeechModel",
    "adapt",
    "at_precision",
    "decode",
    "log_mel",
    "log_mel_windows",
    "lower_speech",
    "mel_filters",
    "normalized_words",
    "read_wav",
    "runner_metadata",
    "word_error_rate",
]
