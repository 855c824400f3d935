"""Speculative decoding over a ``.pte``'s ``verify`` method: fewer target calls, the greedy tokens exactly.

A drafter proposes the next tokens; one ``verify`` call
(:mod:`coreai_partitioner.text_decoder.verify`) gives the target's logits at
the last token and at every draft; the drafts the target's own argmax agrees
with are kept, and the first row that disagrees gives the next token (the
"bonus").  Every kept token is the one greedy decoding gives, so the output is
greedy's token for token; what changes is how many target calls it takes.
The caches roll back by position: the next call starts where the accepted
tokens end.

Drafters (:data:`DRAFTERS`):

- :class:`PromptLookup`: the tokens that followed the last n-gram where it
  appeared before, in the prompt or the text so far (transformers'
  ``prompt_lookup_num_tokens``, the same search);
- :class:`Lookahead`: n-gram lookahead as ExecuTorch's ``lookahead_decode``
  keeps it: an n-gram cache filled from the text and from each verify call's
  own guesses past the accepted tokens (its Jacobi iteration), drafted from
  by the last token;
- :class:`DraftModel`: a smaller model's ``.pte`` with the same vocabulary,
  exported like any other, drafting greedily over its own caches.

:func:`speculative_decode` is the loop; :class:`Stats` what it counts.  Only
greedy decoding is speculated: sampling is refused (:func:`check_sampling`).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from coreai_partitioner.text_decoder.shapes import DecoderShapes
from coreai_partitioner.text_generation.generate import method_for, prefill_calls

#: The drafters ``--speculate`` names; a draft model is ``draft:PATH.pte``.
DRAFTERS = ("prompt-lookup", "lookahead", "draft")


class SpeculationError(ValueError):
    """A speculative run that cannot be made as asked; names the reason and the fix."""


@dataclass
class Stats:
    """What a generation cost: the tokens, the target's calls (the prompt's counted as one), the drafter's calls,
    and the drafts each verify call accepted (``accepted``)."""

    tokens: list[int] = field(default_factory=list)
    target_calls: int = 0
    draft_calls: int = 0
    accepted: list[int] = field(default_factory=list)
    prompt_calls: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "tokens": list(self.tokens),
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "accepted": list(self.accepted),
        }


def check_sampling(temperature: float, speculate: str | None, *, greedy_only: bool = False) -> None:
    """Refuse sampling with a drafter: the verify rule here keeps greedy's tokens, not a sampled distribution
    (``greedy_only``: refuse sampling at all, for a loop that has none)."""
    if greedy_only and not speculate and temperature > 0:
        raise SpeculationError(
            f"temperature {temperature}: this loop decodes greedily; sampling is ExecuTorch's runner's (export --generate)"
        )
    if speculate and temperature > 0:
        raise SpeculationError(
            f"--speculate {speculate} keeps greedy decoding's tokens exactly; with temperature {temperature} it would "
            "sample differently from the model without saying so. Use --temperature 0 with --speculate, or drop "
            "--speculate to sample"
        )


class Target:
    """A text-generation ``.pte`` driven through ExecuTorch's runtime: prompt calls, ``forward`` and ``verify``."""

    def __init__(self, pte: str | os.PathLike, data_path: str | os.PathLike | None = None) -> None:
        from coreai_partitioner.text_generation.text import runner_shapes

        self.pte = pte
        self.data_path = data_path
        self.shapes: DecoderShapes = runner_shapes(pte, data_path=data_path)

    def run(self, method: str, *inputs: torch.Tensor) -> torch.Tensor:
        import coreai_partitioner.verify as verify

        return verify.run(self.pte, *inputs, method=method, data_path=self.data_path)[0]

    @property
    def verify_len(self) -> int:
        return self.shapes.verify_tokens

    def prefill(self, tokens: Sequence[int], start: int = 0) -> tuple[torch.Tensor, int]:
        """``tokens`` fed from cache position ``start``; the last call's last logits ``[vocab]`` and the calls made."""
        calls = prefill_calls(list(tokens), start, self.shapes)
        for chunk, positions, _ in calls:
            logits = self.run(method_for(chunk, self.shapes), chunk, positions)
        return logits[0, -1], len(calls)

    def forward(self, token: int, position: int) -> torch.Tensor:
        """The logits ``[vocab]`` after ``token`` at ``position``."""
        return self.run("forward", torch.tensor([[token]]), torch.tensor([position]))[0, -1]

    def verify(self, tokens: Sequence[int], position: int) -> torch.Tensor:
        """Every position's logits ``[verify_len, vocab]`` for ``tokens`` at ``position`` on, padded to the method's
        length with a repeat of the last token; the rows after the drafts' are not read (their writes roll back)."""
        length = self.verify_len
        padded = list(tokens) + [tokens[-1]] * (length - len(tokens))
        logits = self.run("verify", torch.tensor([padded]), torch.arange(position, position + length))
        return logits[0]


class Drafter:
    """Proposes up to ``k`` tokens after ``context`` (the prompt and every token so far, the last one not yet in
    the target's caches); :meth:`observe` hears what a verify call saw."""

    calls = 0

    def start(self, prompt: Sequence[int]) -> None:
        """A new generation from ``prompt``."""

    def propose(self, context: Sequence[int], position: int, k: int) -> list[int]:
        raise NotImplementedError

    def observe(self, context: Sequence[int], guesses: Sequence[int], accepted: int) -> None:
        """After a verify call: ``context`` now holds the kept tokens and the bonus; ``guesses`` are the target's
        argmax at every row of the call, ``accepted`` how many drafts it kept."""


class PromptLookup(Drafter):
    """The ``k`` tokens after the first earlier occurrence of the context's last n-gram (``max_ngram`` down to 1),
    as transformers' ``PromptLookupCandidateGenerator`` searches (``max_matching_ngram_size``), EOS excluded."""

    def __init__(self, max_ngram: int = 2, eos_ids: Collection[int] = ()) -> None:
        self.max_ngram = max_ngram
        self.eos_ids = set(eos_ids)

    def propose(self, context: Sequence[int], position: int, k: int) -> list[int]:
        length = len(context)
        for size in range(min(self.max_ngram, length - 1), 0, -1):
            tail = list(context[-size:])
            for start in range(length - size + 1):
                if list(context[start : start + size]) != tail:
                    continue
                begin, end = start + size, min(start + size + k, length)
                if begin < end:
                    drafts = list(context[begin:end])
                    for i, token in enumerate(drafts):
                        if token in self.eos_ids:
                            return drafts[:i]
                    return drafts
        return []


class Lookahead(Drafter):
    """N-gram lookahead (Jacobi decoding with an n-gram cache, ExecuTorch's ``lookahead_decode``'s pool) over a
    causal verify call.

    The pool maps a token to the ``ngram - 1`` tokens that followed it: every
    n-gram of the prompt and of the text so far, and every n-gram of each verify
    call's guesses (the target's argmax at each row, past the accepted drafts
    conditioned on the drafts before them: one Jacobi step).  A draft is the
    newest continuation of the last token, followed on from its own last
    token while the pool has one, up to ``k``.  Where the pool has none, the
    draft is the Jacobi iterate: the last call's guesses for the positions
    after it (at the start, the prompt's last tokens, as ``lookahead_decode``
    seeds its window from the prompt), so every call still feeds the pool.
    """

    def __init__(self, ngram: int = 4, pool_size: int = 8) -> None:
        if ngram < 2:
            raise SpeculationError(f"lookahead n-gram size {ngram}: give 2 or more")
        self.ngram = ngram
        self.pool_size = pool_size
        self.pool: dict[int, list[tuple[int, ...]]] = defaultdict(list)

    def start(self, prompt: Sequence[int]) -> None:
        self.pool.clear()
        self._add_ngrams(prompt)
        self.iterate = list(prompt[-self.ngram :])

    def _add(self, key: int, follow: tuple[int, ...]) -> None:
        entries = self.pool[key]
        if follow in entries:
            entries.remove(follow)
        entries.append(follow)  # newest last
        del entries[: -self.pool_size]

    def _add_ngrams(self, tokens: Sequence[int]) -> None:
        for i in range(len(tokens) - self.ngram + 1):
            self._add(tokens[i], tuple(tokens[i + 1 : i + self.ngram]))

    def propose(self, context: Sequence[int], position: int, k: int) -> list[int]:
        drafts: list[int] = []
        last = context[-1]
        while len(drafts) < k and self.pool.get(last):
            follow = self.pool[last][-1]
            drafts.extend(follow)
            last = drafts[-1]
        return drafts[:k] or self.iterate[:k]

    def observe(self, context: Sequence[int], guesses: Sequence[int], accepted: int) -> None:
        self._add_ngrams(context[-(accepted + self.ngram) :])
        self.iterate = list(guesses[accepted + 1 :])
        self._add_ngrams(list(context[-1:]) + self.iterate)


class DraftModel(Drafter):
    """A smaller model's ``.pte`` (the same vocabulary) drafting greedily, one ``forward`` call a token, over its
    own caches, which roll back by position as the target's do."""

    def __init__(self, pte: str | os.PathLike, data_path: str | os.PathLike | None = None) -> None:
        self.model = Target(pte, data_path)
        self.fed = 0  # the draft model's caches hold the context's first `fed` tokens

    def check_against(self, target: Target) -> None:
        import coreai_partitioner.verify as verify

        vocab = [int(verify.run(t.pte, method="get_vocab_size", data_path=t.data_path)[0]) for t in (target, self.model)]
        if vocab[0] != vocab[1]:
            raise SpeculationError(
                f"the draft model {self.model.pte} has a vocabulary of {vocab[1]} tokens, the target {vocab[0]}: a "
                "draft model must share the target's tokenizer"
            )

    def start(self, prompt: Sequence[int]) -> None:
        self.fed = 0

    def propose(self, context: Sequence[int], position: int, k: int) -> list[int]:
        shapes = self.model.shapes
        if len(context) + k > shapes.max_context_len:
            return []
        logits, calls = self.model.prefill(context[self.fed :], self.fed)  # what it has not seen, the last token included
        self.calls += calls
        drafts = [int(logits.argmax())]
        position = len(context)
        while len(drafts) < k:
            logits = self.model.forward(drafts[-1], position)
            self.calls += 1
            drafts.append(int(logits.argmax()))
            position += 1
        self.fed = len(context) + len(drafts) - 1  # the last draft was never fed
        return drafts

    def observe(self, context: Sequence[int], guesses: Sequence[int], accepted: int) -> None:
        self.fed = min(self.fed, len(context) - 1)  # the bonus is new; a rejected draft's rows roll back


def drafter_for(speculate: str, *, eos_ids: Collection[int] = (), data_path: str | os.PathLike | None = None) -> Drafter:
    """The drafter ``--speculate`` names: ``prompt-lookup``, ``lookahead`` or ``draft:PATH.pte``."""
    if speculate == "prompt-lookup":
        return PromptLookup(eos_ids=eos_ids)
    if speculate == "lookahead":
        return Lookahead()
    if speculate.startswith("draft:"):
        path = speculate.split(":", 1)[1]
        if not os.path.isfile(path):
            raise SpeculationError(f"--speculate {speculate}: no draft .pte at {path}; export one with `export`")
        return DraftModel(path, data_path)
    raise SpeculationError(f"--speculate {speculate!r}: choose prompt-lookup, lookahead or draft:PATH.pte")


def speculative_decode(
    target: Target,
    prompt: Sequence[int],
    max_new_tokens: int,
    drafter: Drafter | None,
    *,
    draft_len: int | None = None,
    eos_ids: Collection[int] = (),
    on_token: Callable[[int], None] | None = None,
) -> Stats:
    """Greedy generation of up to ``max_new_tokens`` after ``prompt`` through ``target``, its drafts verified;
    :class:`Stats`.  ``drafter=None`` decodes greedily, one ``forward`` call a token.

    Ends at ``max_new_tokens`` or after an EOS id (kept), as ``generate`` does.
    ``draft_len`` (default: the verify call's most, ``get_max_draft_len``)
    caps the drafts of one call.  Starts from an empty cache.
    """
    if not prompt:
        raise ValueError("the prompt is empty; give at least one token")
    most = target.verify_len - 1
    if drafter is not None and most < 1:
        raise SpeculationError(
            f"{target.pte} has no verify method (get_verify_len): export it again with this version (the host form's "
            "enumerated shapes have none: export with --shapes dynamic)"
        )
    k = most if draft_len is None else draft_len
    if drafter is not None and not 1 <= k <= most:
        raise SpeculationError(f"--draft-len {k}: the .pte verifies 1 to {most} drafts a call (get_max_draft_len)")
    prefill_calls(list(prompt) + [0] * max(max_new_tokens - 1, 0), 0, target.shapes)  # raises if it cannot fit
    eos = set(eos_ids)
    stats = Stats()
    if drafter is not None:
        drafter.start(prompt)
        drafter.calls = 0
    logits, stats.prompt_calls = target.prefill(prompt)
    stats.target_calls = 1
    context = list(prompt)
    position = len(prompt)  # where the last token goes: the caches hold every position before it

    def emit(token: int) -> bool:
        """Keep ``token``; whether generation goes on."""
        stats.tokens.append(token)
        context.append(token)
        if on_token is not None:
            on_token(token)
        return token not in eos and len(stats.tokens) < max_new_tokens

    going = emit(int(logits.argmax()))
    while going:
        # A verify call writes all its rows: it must fit in the cache whole, else the rest go one token a call.
        fits = position + target.verify_len <= target.shapes.max_context_len
        drafts = drafter.propose(context, position, k) if drafter is not None and fits else []
        if not drafts:
            going = emit(int(target.forward(context[-1], position).argmax()))
            stats.target_calls += 1
            position += 1
            continue
        rows = target.verify([context[-1], *drafts], position)
        stats.target_calls += 1
        guesses = [int(t) for t in rows.argmax(-1)]
        kept = 0
        while kept < len(drafts) and guesses[kept] == drafts[kept]:
            kept += 1
        stats.accepted.append(kept)
        for token in guesses[: kept + 1]:  # the kept drafts, then the target's own next token
            going = emit(token)
            if not going:
                break
        position += kept + 1
        drafter.observe(context, guesses, kept)
    if drafter is not None:
        stats.draft_calls = drafter.calls
    return stats


def chat_or_raw(tokenizer_dir: str | os.PathLike, prompt: str, raw: bool) -> str:
    """``prompt`` in the chat template of the tokenizer in ``tokenizer_dir`` (as an instruct model's user expects),
    or as it is with ``raw`` or where the tokenizer has no template."""
    if raw or not os.path.isdir(tokenizer_dir):
        return prompt
    from transformers import AutoTokenizer

    from coreai_partitioner.console import NativeStreams

    try:
        with NativeStreams():
            hf_tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    except (OSError, ValueError):
        return prompt
    if not getattr(hf_tokenizer, "chat_template", None):
        return prompt
    messages = [{"role": "user", "content": prompt}]
    return hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def generate(
    pte: str | os.PathLike,
    tokenizer: str | os.PathLike,
    prompt: str,
    *,
    max_new_tokens: int,
    speculate: str | None = None,
    draft_len: int | None = None,
    data_path: str | os.PathLike | None = None,
    raw: bool = False,
    on_text: Callable[[str], None] | None = None,
) -> tuple[str, Stats]:
    """``prompt`` (in the tokenizer's chat template unless ``raw``) to text through ``pte``'s methods in
    ExecuTorch's runtime, greedily, with the drafter ``speculate`` names (:func:`drafter_for`) or none;
    the text (EOS left out) and the :class:`Stats`.  ``tokenizer`` is a checkpoint directory or a tokenizer file."""
    from coreai_partitioner.text_decoder.tokenizer import find
    from coreai_partitioner.text_generation.generate import eos_ids_of
    from coreai_partitioner.text_generation.text import TokenText

    if not os.path.isfile(pte):
        raise SpeculationError(f"no .pte at {pte}")
    tokenizer_file = find(tokenizer) if os.path.isdir(tokenizer) else tokenizer
    if tokenizer_file is None:
        raise SpeculationError(f"--tokenizer {tokenizer}: no tokenizer file there (tokenizer.json, tokenizer.model, ...)")
    pieces: list[str] = []

    def said(text: str) -> None:
        pieces.append(text)
        if on_text is not None:
            on_text(text)

    text = TokenText(tokenizer_file, said)
    ids = text.encode(chat_or_raw(tokenizer, prompt, raw))
    eos = eos_ids_of(pte)
    target = Target(pte, data_path)
    drafter = drafter_for(speculate, eos_ids=eos, data_path=None) if speculate else None
    if isinstance(drafter, DraftModel):
        drafter.check_against(target)

    def feed(token: int) -> None:
        if token not in eos:
            text.feed(token)

    stats = speculative_decode(target, ids, max_new_tokens, drafter, draft_len=draft_len, eos_ids=eos, on_token=feed)
    text.close()
    return "".join(pieces), stats
