"""The loop an app runs over a speech ``.pte``: ``encoder`` once, then ``text_decoder`` a token at a time.

ExecuTorch 1.5.1 has no Python bindings for its ASR runner
(``extension/asr/runner/seq2seq_runner.cpp``); :class:`SpeechProgram` calls the
``.pte``'s methods through ExecuTorch's own runtime the way it does, with
this package's host Core AI backend: ``encoder(features)``, then
``text_decoder(ids [1, 1], encoder output, cache_position [1])`` at positions
0, 1, 2, ..., its logits' argmax fed back, until an EOS id.

:func:`decode` is that loop with Hugging Face's greedy rules for Whisper
(:class:`DecodingRules`): the decoder prompt ``generate`` makes for a language
and task without timestamps (``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>``),
the suppressed tokens, ``max_length`` counting the prompt.  Both are every
encoder-decoder's (:mod:`coreai_partitioner.seq2seq`); this module adds what
reads a recording and prints its text.
"""

from __future__ import annotations

import os
import re

from coreai_partitioner.seq2seq.decode import GENERATION_FILE, Decoded, DecodingError, DecodingRules, TextDecoderCall, decode
from coreai_partitioner.seq2seq.program import Seq2SeqProgram
from coreai_partitioner.speech_recognition.features import FeatureSettings, log_mel, read_wav

__all__ = [
    "GENERATION_FILE", "Decoded", "DecodingError", "DecodingRules", "SpeechProgram", "TextDecoderCall", "decode",
    "normalized_words", "word_error_rate",
]


class SpeechProgram(Seq2SeqProgram):
    """A speech ``.pte`` loaded in ExecuTorch's runtime (Core AI delegates on this package's host backend).

    ``directory`` (default: the ``.pte``'s) holds what the export wrote
    beside it: ``tokenizer.json``, ``preprocessor_config.json``, ``generation_config.json``.
    """

    EXPORT = "a speech checkpoint (python -m coreai_partitioner export --checkpoint DIR)"

    @property
    def settings(self) -> FeatureSettings:
        return FeatureSettings.read(self.directory, n_mels=int(self.constant("get_n_mels")))

    def transcribe(self, wav: str | os.PathLike, *, language: str | None = "en", task: str = "transcribe") -> str:
        """The text of a 16 kHz mono wav of at most 30 s (:func:`~.features.read_wav` refuses others)."""
        settings = self.settings
        audio = read_wav(wav, settings)
        rules = DecodingRules.read(self.directory, language=language, task=task)
        return self.text(self.decode(log_mel(audio, settings), rules).ids)


def normalized_words(text: str) -> list[str]:
    """The words of ``text``, lowercased, punctuation dropped (apostrophes kept inside words)."""
    return re.sub(r"[^\w' ]+", " ", text.lower()).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word edit distance of ``hypothesis`` from ``reference`` over the reference's word count (normalized words)."""
    ref, hyp = normalized_words(reference), normalized_words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, start=1):
        previous, row[0] = row[0], i
        for j, other in enumerate(hyp, start=1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (word != other))
    return row[len(hyp)] / max(len(ref), 1)
