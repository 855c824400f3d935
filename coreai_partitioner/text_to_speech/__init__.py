"""Text-to-speech: a checkpoint to one ``.pte`` with two methods, split where the length becomes data-dependent, and the
loop that runs them to a waveform.

- :mod:`.tiny`: the tiny random config (``--config vits``);
- :mod:`.vits`: transformers' ``VitsModel`` (MMS-TTS): ``durations`` and ``decoder``, :func:`~.vits.lower_vits`,
  :func:`~.vits.synthesize`, :func:`~.vits.write_wav`.
"""

from coreai_partitioner.text_to_speech.vits import (
    METHODS,
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
    "METHODS", "Durations", "Frames", "UnsupportedVits", "VitsProgram", "durations_of", "lower_vits", "synthesize", "write_wav",
]
