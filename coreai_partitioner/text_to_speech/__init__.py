"""Text-to-speech: a checkpoint to one ``.pte`` with two methods, split where the length becomes data-dependent, and the
loop that runs them to a waveform.

- :mod:`.vits`: transformers' ``VitsModel`` (MMS-TTS): ``durations`` and ``decoder``, :func:`~.vits.lower_vits`,
  :func:`~.vits.synthesize`.
"""

from coreai_partitioner.text_to_speech.vits import (
    METHODS,
    Durations,
    Frames,
    UnsupportedVits,
    VitsProgram,
    lower_vits,
    synthesize,
)

__all__ = ["METHODS", "Durations", "Frames", "UnsupportedVits", "VitsProgram", "lower_vits", "synthesize"]
