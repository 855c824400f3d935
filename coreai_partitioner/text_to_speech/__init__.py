"""Text-to-speech: a checkpoint to one ``.pte`` with two methods, split where the length becomes data-dependent, and the
loop that runs them to a waveform.

- :mod:`.program`: :class:`~.program.SpeechProgram`, a ``.pte`` of either family loaded for its loop;
- :mod:`.tiny`: the tiny random configs (``--config vits``, ``--config kokoro``);
- :mod:`.vits`: transformers' ``VitsModel`` (MMS-TTS): ``durations`` and ``decoder``, :func:`~.vits.lower_vits`,
  :func:`~.vits.synthesize`, :func:`~.vits.write_wav`;
- :mod:`.kokoro`: Kokoro-82M's ``KModel``: the same two methods (its vocoder in :mod:`.istftnet`), :func:`~.kokoro.lower_kokoro`,
  :func:`~.kokoro.synthesize` with a voice.
"""

from coreai_partitioner.text_to_speech.program import METHODS, SpeechProgram
from coreai_partitioner.text_to_speech.vits import (
    Durations,
    Frames,
    UnsupportedVits,
    VitsProgram,
    durations_of,
    lower_vits,
    synthesize,
    write_wav,
)

__all__ = [
    "METHODS", "Durations", "Frames", "SpeechProgram", "UnsupportedVits", "VitsProgram", "durations_of", "lower_vits",
    "synthesize", "write_wav",
]
