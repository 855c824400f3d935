"""Feeding a lowered decoder: prompt calls, greedy decoding, and text from a runner's pieces."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner.text_decoder.shapes import DecoderShapes


def prefill_calls(tokens: list[int], start: int, shapes: DecoderShapes) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """The ``forward`` calls that feed ``tokens`` from cache position ``start``: ``(tokens, input_pos, used)``.

    One call per ``prefill_chunk`` tokens.  With enumerated shapes a shorter
    call is padded in front to the chunk, the padding at positions past the
    context (``max_context_len`` on), which write no cache slot and which no
    real token attends; the call's last position is its last real token, so
    last-position logits are the prompt's either way.  The device form's static
    layout takes whole chunks (its ``prefill`` method) and the rest one token a
    call (``forward``): no padding.  ``used`` is the number of real tokens;
    :func:`method_for` names the method of a call.  Raises if the tokens do not
    fit in the context.
    """
    if start + len(tokens) > shapes.max_context_len:
        raise ValueError(
            f"{start + len(tokens)} tokens do not fit in the context of {shapes.max_context_len} "
            "(max_context_len, the cache length); export with a longer context or shorten the prompt"
        )
    if shapes.device and not shapes.bounded:
        whole = len(tokens) - len(tokens) % shapes.prefill_chunk
        offsets = list(range(0, whole, shapes.prefill_chunk)) + list(range(whole, len(tokens)))
        ends = offsets[1:] + [len(tokens)]
        return [
            (torch.tensor([tokens[a:b]]), torch.arange(start + a, start + b), b - a) for a, b in zip(offsets, ends)
        ]
    calls = []
    for offset in range(0, len(tokens), shapes.prefill_chunk):
        chunk = tokens[offset : offset + shapes.prefill_chunk]
        used = len(chunk)
        position = start + offset
        positions = list(range(position, position + used))
        if shapes.mode == "enumerated" and used not in (1, shapes.prefill_chunk):
            padding = shapes.prefill_chunk - used
            chunk = [0] * padding + chunk
            positions = list(range(shapes.max_context_len, shapes.max_context_len + padding)) + positions
        calls.append((torch.tensor([chunk]), torch.tensor(positions), used))
    return calls


def method_for(tokens: torch.Tensor, shapes: DecoderShapes) -> str:
    """The method a call of ``tokens`` [1, T] goes to: the static device layout's ``prefill`` for a whole chunk,
    else ``forward``."""
    static = shapes.device and not shapes.bounded
    return "prefill" if static and tokens.shape[-1] == shapes.prefill_chunk > 1 else "forward"


def check_call(tokens: torch.Tensor, shapes: DecoderShapes) -> None:
    """Raise, naming the limit, if ``tokens`` [1, T] is not a length the exported methods take."""
    length = tokens.shape[-1]
    if shapes.device and not shapes.bounded:
        if length not in (1, shapes.prefill_chunk):
            raise ValueError(
                f"the device form takes 1 token (forward) or {shapes.prefill_chunk} (prefill), not {length}: "
                "split the call (text_generation.prefill_calls)"
            )
        return
    allowed = (1, shapes.prefill_chunk) if shapes.mode == "enumerated" else range(1, shapes.prefill_chunk + 1)
    if length not in allowed:
        limit = (
            f"T in {{1, {shapes.prefill_chunk}}} (enumerated shapes)"
            if shapes.mode == "enumerated"
            else f"T from 1 to the prefill chunk {shapes.prefill_chunk}"
        )
        raise ValueError(f"forward got {length} tokens; it was exported for {limit}: split or pad the call")


def eos_ids_of(program: Any) -> tuple[int, ...]:
    """The EOS ids a ``.pte`` gives ExecuTorch's runner (its ``get_eos_ids`` method; none if it has none)."""
    import coreai_partitioner.verify as verify

    try:
        return tuple(int(i) for i in verify.run(program, method="get_eos_ids"))
    except verify.UnsupportedProgram:
        return ()


def prefill(program: Any, prompt: list[int], shapes: DecoderShapes) -> torch.Tensor:
    """``prompt`` fed to a lowered decoder from an empty cache, one call per chunk (:func:`prefill_calls`); the
    last call's logits.  ``program`` is what ``verify.run`` takes."""
    import coreai_partitioner.verify as verify

    verify.reset_state(program)
    for chunk, positions, _ in prefill_calls(prompt, 0, shapes):
        (logits,) = verify.run(program, chunk, positions, method=method_for(chunk, shapes))
    return logits


def decode_tokens(
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    logits: torch.Tensor,
    position: int,
    new_tokens: int,
    eos_ids: Collection[int],
    pick: Callable[[torch.Tensor], int] | None = None,
) -> Iterator[int]:
    """The tokens after a prefill whose logits are ``logits``, one ``forward(tokens, input_pos)`` call each.

    The first goes to cache ``position``.  Ends after ``new_tokens``, or at
    an EOS id (yielded), as ``generate`` does.  ``pick`` turns a position's
    logits ``[vocab]`` into a token (the argmax if ``None``).
    """
    for count in range(1, new_tokens + 1):
        token = int(logits[0, -1].argmax()) if pick is None else pick(logits[0, -1])
        yield token
        if count == new_tokens or token in eos_ids:
            return
        logits = forward(torch.tensor([[token]]), torch.tensor([position]))
        position += 1


def greedy_decode(
    program: Any, prompt: list[int], new_tokens: int, shapes: DecoderShapes, *, eos_ids: tuple[int, ...] | None = None
) -> list[int]:
    """Greedy generation through a lowered :func:`~.export.lower_decoder` program, on the Core AI runtime.

    Prefills the prompt in one ``forward`` call per ``prefill_chunk`` tokens,
    then feeds its own argmax one token at a time; returns prompt plus up to
    ``new_tokens`` tokens, ending at the first EOS token (included), as
    ``generate`` does.  ``eos_ids`` defaults to the program's own
    (``get_eos_ids``, what ExecuTorch's runner stops at); ``()`` never stops.
    Starts from an empty cache.  ``program`` is what ``verify.run`` takes
    (the lowered program, its ``to_executorch()``, a ``.pte``).
    """
    import coreai_partitioner.verify as verify

    if not prompt:
        raise ValueError("the prompt is empty; give at least one token")
    prefill_calls(prompt + [0] * (new_tokens - 1), 0, shapes)  # raises if it cannot fit
    if eos_ids is None:
        eos_ids = eos_ids_of(program)

    def forward(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return verify.run(program, tokens, positions)[0]

    logits = prefill(program, prompt, shapes)
    return list(prompt) + list(decode_tokens(forward, logits, len(prompt), new_tokens, eos_ids))


@dataclass(frozen=True)
class Generation:
    """What one text generation produced: the text, the token counts and the seconds of its two phases."""

    text: str
    prompt_tokens: int
    generated_tokens: int
    prompt_seconds: float
    decode_seconds: float

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: the tokens after the first (which the prompt's call yields) over the decode time."""
        steps = max(self.generated_tokens - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds > 0 else 0.0


class TextPieces:
    """Whole characters from the pieces ExecuTorch's runner hands its ``token_callback``.

    The runner's Python binding converts each decoded piece to ``str``; a
    byte-level BPE piece that is part of a multi-byte character is not valid
    UTF-8 alone and cannot be one.  :meth:`callback` is given to the runner
    instead of the user's; it receives the raw bytes (see
    :func:`runner_generate`) and passes on only complete characters.
    """

    def __init__(self, on_text: Callable[[str], None]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._on_text = on_text

    def feed(self, piece: bytes) -> None:
        text = self._decoder.decode(piece)
        if text:
            self._on_text(text)

    def close(self) -> None:
        text = self._decoder.decode(b"", final=True)
        if text:
            self._on_text(text)


def byte_tokenizer(config: Any) -> Any:
    """A ``tokenizers.Tokenizer`` of one character per token, for the tiny configs' 256-token vocabulary.

    Token ``i`` is one printable character (ASCII as itself, the rest from
    U+0100 on), so any token sequence decodes to valid UTF-8 and ExecuTorch's
    LLM runner can print a random model's output.  ``config``'s BOS and EOS
    tokens are special tokens.
    """
    from tokenizers import Tokenizer, decoders, models

    characters = [chr(i) if 32 <= i < 127 else chr(0x100 + i) for i in range(256)]
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(characters)}, merges=[], unk_token=characters[0]))
    tokenizer.decoder = decoders.Fuse()  # tokens are characters: joined as they are, not with spaces
    special = [getattr(config, "bos_token_id", None), getattr(config, "eos_token_id", None)]
    tokenizer.add_special_tokens([characters[i] for i in special if isinstance(i, int)])
    return tokenizer
