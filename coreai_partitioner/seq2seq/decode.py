"""Greedy decoding of one input whose encoder output is given, a ``text_decoder`` call per token.

:func:`decode` is the loop an app runs after ``encoder``: the decoder prompt
fed a token a call from position 0 (as ExecuTorch's ASR runner feeds its
start token), then each step's argmax fed back until an EOS id, with Hugging
Face's greedy rules (:class:`DecodingRules`): the prompt ``generate`` makes
(a start token; a multilingual Whisper's language and task, and its
no-timestamps token), the suppressed tokens set to ``-inf`` at every step
(``SuppressTokensLogitsProcessor``) and the begin-suppressed ones at the
first generated token (``SuppressTokensAtBeginLogitsProcessor``),
``max_length`` counting the prompt.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

#: The file beside the ``.pte`` that holds the decoding rules (HF's ``GenerationConfig`` keys).
GENERATION_FILE = "generation_config.json"


class DecodingError(ValueError):
    """Rules a model's generation config cannot give (an unknown language or task); names what it takes."""


@dataclass(frozen=True)
class DecodingRules:
    """How Hugging Face's ``generate`` decodes greedily: the decoder prompt (a multilingual Whisper's for one language
    and task, without timestamps), the EOS ids, the suppressed tokens, the length."""

    prompt: tuple[int, ...]
    eos_ids: tuple[int, ...]
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()
    max_length: int = 448  # prompt plus generated tokens, as generate's max_length

    @classmethod
    def of(cls, generation: Any, *, language: str | None = "en", task: str = "transcribe") -> DecodingRules:
        """The rules of a ``GenerationConfig`` (or its dict, as ``generation_config.json`` holds it).

        A multilingual model's prompt names ``language`` (``"en"`` or
        ``"<|en|>"``) and ``task``, as ``generate(language=..., task=...)``
        does; an English-only Whisper's has neither, and a T5's is its start token alone.
        """
        config = generation.to_dict() if hasattr(generation, "to_dict") else dict(generation)
        prompt = [int(config["decoder_start_token_id"])]
        languages = config.get("lang_to_id") or {}
        if config.get("is_multilingual") and languages:
            token = language if language is None or language.startswith("<|") else f"<|{language}|>"
            if token not in languages:
                raise DecodingError(
                    f"language {language!r}: the model knows {', '.join(sorted(t.strip('<|>') for t in languages))}"
                )
            tasks = config.get("task_to_id") or {}
            if task not in tasks:
                raise DecodingError(f"task {task!r}: the model knows {', '.join(sorted(tasks))}")
            prompt += [int(languages[token]), int(tasks[task])]
        if config.get("no_timestamps_token_id") is not None:
            prompt.append(int(config["no_timestamps_token_id"]))
        eos = config.get("eos_token_id")
        return cls(
            prompt=tuple(prompt),
            eos_ids=(eos,) if isinstance(eos, int) else tuple(eos or ()),
            suppress=tuple(config.get("suppress_tokens") or ()),
            begin_suppress=tuple(config.get("begin_suppress_tokens") or ()),
            max_length=int(config.get("max_length") or 448),
        )

    @classmethod
    def read(cls, directory: str | os.PathLike, **options: Any) -> DecodingRules:
        """The rules of ``directory``'s ``generation_config.json`` (what the export writes beside the ``.pte``)."""
        path = Path(directory) / GENERATION_FILE
        if not path.is_file():
            raise DecodingError(f"{path}: no such file; export the checkpoint again, it writes one beside the .pte")
        return cls.of(json.loads(path.read_text()), **options)

    def pick(self, logits: torch.Tensor, generated: int) -> int:
        """The greedy token from one position's logits ``[vocab]``, the ``generated``-th after the prompt."""
        scores = logits.float().clone()
        if self.suppress:
            scores[list(self.suppress)] = -float("inf")
        if generated == 0 and self.begin_suppress:
            scores[list(self.begin_suppress)] = -float("inf")
        return int(scores.argmax())


#: ``text_decoder(ids [1, 1], cross, cache_position [1]) -> logits [1, 1, vocab]``.
TextDecoderCall = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Decoded:
    """What one input decoded to: the generated ids (EOS left out), each step's logits, the seconds."""

    ids: list[int]
    ended: bool  # an EOS id ended it (not max_length)
    logits: list[torch.Tensor] = field(default_factory=list, repr=False)  # [vocab] per generated token
    prompt_seconds: float = 0.0  # the prompt's calls but the last
    decode_seconds: float = 0.0  # from the last prompt token's call to the end
    encoder_seconds: float = 0.0  # the encoder's call, when Seq2SeqProgram.decode ran it

    @property
    def steps(self) -> int:
        """``text_decoder`` calls after the prompt's: one per generated token, and the one that gave EOS."""
        return len(self.ids) + int(self.ended)

    @property
    def seconds_per_token(self) -> float:
        """Decode time per ``text_decoder`` call after the prompt's."""
        return self.decode_seconds / max(self.steps, 1)


def decode(
    text_decoder: TextDecoderCall,
    cross: torch.Tensor,
    rules: DecodingRules,
    *,
    max_decode_len: int | None = None,
    max_new_tokens: int | None = None,
    keep_logits: bool = False,
) -> Decoded:
    """Greedy decoding of one input, whose encoder output is ``cross``, a ``text_decoder`` call per token.

    The prompt goes in a token a call from position 0 (a new input: the
    caches' earlier content is never read).  Ends at an EOS id, at
    ``rules.max_length`` tokens, at ``max_new_tokens``, or when the cache
    (``max_decode_len`` slots) is full.
    """
    prompt = list(rules.prompt)
    limit = rules.max_length if max_decode_len is None else min(rules.max_length, max_decode_len + 1)
    if len(prompt) >= limit:
        raise ValueError(f"the decoder prompt has {len(prompt)} tokens and the decode length is {limit}")
    started = time.perf_counter()
    for position, token in enumerate(prompt[:-1]):
        text_decoder(torch.tensor([[token]]), cross, torch.tensor([position]))
    tokens, kept = list(prompt), []
    prompt_seconds, started = time.perf_counter() - started, time.perf_counter()
    ended = False
    while True:
        logits = text_decoder(torch.tensor([[tokens[-1]]]), cross, torch.tensor([len(tokens) - 1]))[0, -1]
        if keep_logits:
            kept.append(logits.float().clone())
        token = rules.pick(logits, len(tokens) - len(prompt))
        if token in rules.eos_ids:
            ended = True
            break
        tokens.append(token)
        generated = len(tokens) - len(prompt)
        if len(tokens) >= limit or (max_new_tokens is not None and generated >= max_new_tokens):
            break
    return Decoded(tokens[len(prompt) :], ended, kept, prompt_seconds, time.perf_counter() - started)
