"""A text-to-speech ``.pte`` loaded for its loop, whichever family made it (``get_family``); what ``--verify`` runs
through it (:class:`SpeechReference`); the WAV a run writes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.verify.program import LoadedProgram

#: The methods of every family's ``.pte``, in the order a run calls them.
METHODS = ("durations", "decoder")


class SpeechProgram(LoadedProgram):
    """A text-to-speech ``.pte`` (methods ``durations`` and ``decoder``) loaded in ExecuTorch's runtime."""

    METHODS = METHODS
    EXPORT = "a text-to-speech checkpoint (python -m coreai_partitioner export --checkpoint DIR)"

    @property
    def family(self) -> str:
        """Its family's ``NAME`` (:mod:`.families`): which loop runs it.  A VITS program exported before the
        ``get_family`` constant existed has none: ``"vits"``."""
        from coreai_partitioner.text_to_speech.families import family_of_code

        if "get_family" not in self.program.method_names:
            return "vits"
        value = self.constant("get_family")
        family = family_of_code(value)
        if family is None:
            raise ValueError(f"{self.path}: get_family is {value}, which this package's loop does not know; re-export it")
        return family.NAME


@dataclass(frozen=True)
class SpeechReference:
    """The model's own forward on seeded random ids at a seed: its waveform and per-token durations, and the voice it
    spoke in where its family takes one (Kokoro's style)."""

    ids: list[int]
    seed: int
    waveform: torch.Tensor
    durations: torch.Tensor
    voice: Any = None


def write_wav(waveform: torch.Tensor, sampling_rate: int, path: str | os.PathLike) -> Path:
    """``waveform`` (floats in [-1, 1]) as a 16-bit mono WAV at ``sampling_rate``; the path."""
    import wave

    path = Path(path)
    pcm = (waveform.detach().float().clamp(-1, 1) * 32767).round().to(torch.int16)
    with wave.open(str(path), "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(int(sampling_rate))
        file.writeframes(pcm.numpy().tobytes())
    return path
