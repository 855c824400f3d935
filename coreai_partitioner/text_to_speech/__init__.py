"""Text-to-speech: a checkpoint to one ``.pte`` with two methods, split where the length becomes data-dependent, and the
loop that runs them to a waveform.

- :mod:`.families`: a module a family, found by its name (:func:`~.families.family_of` a config):
  :mod:`.families.vits`, transformers' ``VitsModel`` (MMS-TTS), and :mod:`.families.kokoro`, Kokoro-82M's
  ``KModel`` (its vocoder in :mod:`.istftnet`); each holds its methods, how they lower, and its loop;
- :mod:`.program`: :class:`~.program.SpeechProgram`, a ``.pte`` of any family loaded for its loop, and
  :func:`~.program.write_wav`;
- :mod:`.tiny`: the tiny random configs (``--config vits``, ``--config kokoro``).

:mod:`.program` is imported on first use of its names: it loads ExecuTorch's runtime, and the command line finds
its tasks (this room's families among them) before it holds the dependencies' output down.
"""

from typing import Any

from coreai_partitioner.text_to_speech.families import family_named, family_of, register

_PROGRAM = ("METHODS", "SpeechProgram", "SpeechReference", "write_wav")

__all__ = ["METHODS", "SpeechProgram", "SpeechReference", "family_named", "family_of", "register", "write_wav"]


def __getattr__(name: str) -> Any:
    """One of :mod:`.program`'s names, imported on first use."""
    if name not in _PROGRAM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from coreai_partitioner.text_to_speech import program

    return getattr(program, name)
