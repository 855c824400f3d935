"""A prompt with audio as the runner's inputs, and the exported program run as ExecuTorch's ``MultimodalRunner`` runs it.

:func:`runner_inputs` turns a prompt's ``input_ids`` (each window's
``audio_tokens`` placeholders in a run) and the feature extractor's
``input_features`` ``[windows, bins, frames]`` into the segments an app hands
the runner: text tokens, one audio input per window, text tokens, ...
:func:`generate` runs ExecuTorch's own ``MultimodalRunner`` on a ``.pte``;
:func:`greedy` runs any form of the methods (the eager
:class:`~.model.AudioLanguage`, a lowered program, a ``.pte``) the runner's way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner.audio_text_to_text.errors import UnsupportedAudio
from coreai_partitioner.text_decoder import multimodal
from coreai_partitioner.text_decoder.multimodal import Methods, greedy, prefill

__all__ = ["Methods", "Segment", "check_features", "generate", "greedy", "prefill", "runner_inputs"]


@dataclass(frozen=True)
class Segment:
    """One runner input: text ``tokens``, or one window's ``features`` ``[bins, frames]``."""

    tokens: tuple[int, ...] = ()
    features: torch.Tensor | None = None

    @property
    def is_audio(self) -> bool:
        return self.features is not None

    @property
    def encoder(self) -> str | None:
        """The method that embeds it: ``audio_encoder`` for a window, ``None`` for text (``token_embedding``)."""
        return "audio_encoder" if self.is_audio else None

    def encoder_input(self) -> torch.Tensor:
        return self.features.unsqueeze(0)


def runner_inputs(input_ids: Any, input_features: torch.Tensor, audio_token_id: int, audio_tokens: int) -> list[Segment]:
    """The runner's inputs for a prompt: text between windows, a window per ``audio_tokens`` placeholders.

    ``input_ids`` is ``[1, L]`` (or a list); ``input_features`` the feature
    extractor's windows ``[windows, bins, frames]``, which go to the
    placeholder runs in order: a recording of two windows is two runs of
    placeholders back to back, two audio inputs.
    """
    ids = torch.as_tensor(input_ids)
    ids = (ids[0] if ids.dim() == 2 else ids).tolist()
    windows = [] if input_features is None else list(input_features.reshape(-1, *input_features.shape[-2:]).contiguous())
    pieces = multimodal.split_prompt(
        ids, windows, audio_token_id, audio_tokens, what="audio window", source="input_features", error=UnsupportedAudio
    )
    return [Segment(tokens=piece) if isinstance(piece, tuple) else Segment(features=piece) for piece in pieces]


def check_features(features: torch.Tensor, window: tuple[int, int]) -> None:
    """Raise unless ``features`` is windows ``[W, bins, frames]`` (or one ``[bins, frames]``) of the exported ``window``."""
    if features.dim() not in (2, 3) or tuple(features.shape[-2:]) != tuple(window):
        raise UnsupportedAudio(
            f"features of shape {tuple(features.shape)}: the audio encoder was exported for windows "
            f"[{window[0]}, {window[1]}] (mel bins, frames); give the feature extractor's input_features "
            "(preprocessor_config.json beside the .pte), one window a runner audio input"
        )


def generate(
    pte: str | os.PathLike, tokenizer: str | os.PathLike, segments: Sequence[Segment], new_tokens: int
) -> list[str]:
    """ExecuTorch's own ``MultimodalRunner`` on ``pte``: its greedy output after ``segments`` (a window a
    ``make_audio_input`` of ``[1, bins, frames]``), one piece per generated token, the first being the prefill's."""

    def inputs(runner: Any) -> list:
        return [
            runner.make_audio_input(s.encoder_input().float().contiguous()) if s.is_audio else runner.make_token_input(list(s.tokens))
            for s in segments
        ]

    return multimodal.generate(pte, tokenizer, inputs, new_tokens)
