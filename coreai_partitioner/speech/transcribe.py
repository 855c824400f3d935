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
fed a token a call as the runner feeds its start token; the suppressed tokens
set to ``-inf`` at every step (``SuppressTokensLogitsProcessor``), and the
begin-suppressed ones at the first generated token
(``SuppressTokensAtBeginLogitsProcessor``); ``max_length`` counting the prompt.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.speech.features import FeatureSettings, log_mel, read_wav

#: The file beside the ``.pte`` that holds the decoding rules (HF's ``GenerationConfig`` keys).
GENERATION_FILE = "generation_config.json"


class DecodingError(ValueError):
    """Rules a model's generation config cannot give (an unknown language or task); names what it takes."""


@dataclass(frozen=True)
class DecodingRules:
    """How Hugging Face's ``generate`` decodes Whisper greedily for one language and task, without timestamps."""

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
        does; an English-only model's has neither.
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
    """What one utterance decoded to: the generated ids (EOS left out), each step's logits, the seconds."""

    ids: list[int]
    ended: bool  # an EOS id ended it (not max_length)
    logits: list[torch.Tensor] = field(default_factory=list, repr=False)  # [vocab] per generated token
    prompt_seconds: float = 0.0  # the prompt's calls but the last
    decode_seconds: float = 0.0  # from the last prompt token's call to the end
    encoder_seconds: float = 0.0  # the encoder's call, when SpeechProgram.decode ran it

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
    """Greedy decoding of one utterance, whose encoder output is ``cross``, a ``text_decoder`` call per token.

    The prompt goes in a token a call from position 0 (a new utterance: the
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


class SpeechProgram:
    """A speech ``.pte`` loaded in ExecuTorch's runtime (Core AI delegates on this package's host backend).

    ``directory`` (default: the ``.pte``'s) holds what the export wrote
    beside it: ``tokenizer.json``, ``preprocessor_config.json``, ``generation_config.json``.
    """

    def __init__(self, pte: str | os.PathLike, directory: str | os.PathLike | None = None) -> None:
        from coreai_partitioner.backends.apple_coreai.runtime import host

        self.path = Path(pte)
        self.directory = Path(directory) if directory is not None else self.path.parent
        self.program = host.load_program(self.path)
        missing = {"encoder", "text_decoder"} - set(self.program.method_names)
        if missing:
            raise ValueError(
                f"{self.path}: no method {', '.join(sorted(missing))}; it has {', '.join(sorted(self.program.method_names))}: "
                "export a speech checkpoint (python -m coreai_partitioner export --checkpoint DIR)"
            )
        self._encoder = self.program.load_method("encoder")
        self._decoder = self.program.load_method("text_decoder")
        self.max_decode_len = int(self.constant("get_max_seq_len"))

    def constant(self, name: str) -> Any:
        """A constant method's value (``decoder_start_token_id``, ...); a list's values as a tuple (``get_eos_ids``)."""
        values = tuple(self.program.load_method(name).execute([]))
        return values[0] if len(values) == 1 else values

    @property
    def settings(self) -> FeatureSettings:
        return FeatureSettings.read(self.directory, n_mels=int(self.constant("get_n_mels")))

    def encoder(self, features: torch.Tensor) -> torch.Tensor:
        (cross,) = self._encoder.execute([features])
        return cross.clone()  # the method's own output memory is reused by its next call

    def text_decoder(self, ids: torch.Tensor, cross: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        (logits,) = self._decoder.execute([ids, cross, cache_position])
        return logits

    def decode(self, features: torch.Tensor, rules: DecodingRules, **options: Any) -> Decoded:
        """``encoder`` then :func:`decode` (``options`` are its), the encoder's call timed too."""
        started = time.perf_counter()
        cross = self.encoder(features)
        encoded = time.perf_counter() - started
        decoded = decode(self.text_decoder, cross, rules, max_decode_len=self.max_decode_len, **options)
        decoded.encoder_seconds = encoded
        return decoded

    def transcribe(self, wav: str | os.PathLike, *, language: str | None = "en", task: str = "transcribe") -> str:
        """The text of a 16 kHz mono wav of at most 30 s (:func:`~.features.read_wav` refuses others)."""
        settings = self.settings
        audio = read_wav(wav, settings)
        rules = DecodingRules.read(self.directory, language=language, task=task)
        return self.text(self.decode(log_mel(audio, settings), rules).ids)

    def text(self, ids: list[int]) -> str:
        """``ids`` as text, through the ``tokenizer.json`` beside the ``.pte`` (special tokens left out)."""
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
        return tokenizer.decode(ids, skip_special_tokens=True).strip()


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
