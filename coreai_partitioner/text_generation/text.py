"""Text in, text out over a ``.pte``, in ExecuTorch's runner conventions, whole characters whatever the tokenizer.

ExecuTorch 1.5.1's ``TextLLMRunner`` cannot give Python a character its
tokenizer split over several tokens: its binding converts each piece to
``str`` (``UnicodeDecodeError`` on a partial UTF-8 sequence), and what it
prints itself leaves out every one-byte piece that is not printable ASCII
(``safe_printf``).  :func:`generate_text` runs the same ``.pte`` the same
way (ExecuTorch's runtime, the prompt in one ``forward`` call per chunk,
then one token a call, stopping at the ``.pte``'s EOS ids) and turns tokens
into text with the tokenizer's own library, one whole character at a time:
``tokenizers``' decoder for a ``tokenizer.json`` (what it adds to the text so
far, less a character still incomplete), the token bytes of a tiktoken or
SentencePiece model.  Prompts are encoded by the runner's own
C++ tokenizer, as the runner encodes them (no BOS token added).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any

import torch

from coreai_partitioner.console import NativeStreams
from coreai_partitioner.text_decoder.shapes import DecoderShapes
from coreai_partitioner.text_generation.generate import Generation, TextPieces, decode_tokens, eos_ids_of, prefill, prefill_calls
from coreai_partitioner.text_decoder.tokenizer import check, runner_loaders

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenText:
    """A tokenizer file as the runner reads it: prompts to ids, and generated ids to whole characters."""

    def __init__(self, path: str | os.PathLike, on_text: Callable[[str], None]) -> None:
        loaded = check(path)
        self.kind = loaded.kind
        self._on_text = on_text
        with NativeStreams():
            self._runner = dict(runner_loaders())[self.kind]()
            self._runner.load(str(loaded.path))
        if self.kind == "huggingface":
            from tokenizers import Tokenizer

            self._hf = Tokenizer.from_file(str(loaded.path))
            self._ids: list[int] = []
            self._said = ""
        elif self.kind == "tiktoken":
            from tiktoken.load import load_tiktoken_bpe

            self._pieces = TextPieces(on_text)
            self._ranks = {rank: token for token, rank in load_tiktoken_bpe(str(loaded.path)).items()}
        elif self.kind == "sentencepiece":
            import sentencepiece

            self._pieces = TextPieces(on_text)
            self._sp = sentencepiece.SentencePieceProcessor(model_file=str(loaded.path))
        else:
            raise ValueError(f"{loaded.path}: a llama2c tokenizer has no decoder here; give a tokenizer.json, "
                             "a SentencePiece or a tiktoken model")

    def encode(self, prompt: str) -> list[int]:
        return list(self._runner.encode(prompt, 0, 0))

    def feed(self, token: int) -> None:
        if self.kind == "huggingface":
            self._ids.append(token)
            self._say(self._hf.decode(self._ids, skip_special_tokens=False), final=False)
        elif self.kind == "tiktoken":
            # Special tokens (past the ranks) are text the runner's C++ tokenizer names, as it prints them.
            piece = self._ranks.get(token)
            self._pieces.feed(piece if piece is not None else self._runner.decode(token).encode())
        else:
            piece = self._sp.id_to_piece(token)
            byte = _BYTE_PIECE.fullmatch(piece)
            self._pieces.feed(bytes([int(byte.group(1), 16)]) if byte else piece.replace("\u2581", " ").encode())

    def _say(self, decoded: str, *, final: bool) -> None:
        """Hand on what ``decoded`` (the whole output so far) adds, keeping back a character still incomplete."""
        stable = decoded if final else decoded.rstrip("\ufffd")
        if stable.startswith(self._said) and len(stable) > len(self._said):
            self._on_text(stable[len(self._said) :])
            self._said = stable

    def close(self) -> None:
        if self.kind == "huggingface":
            self._say(self._hf.decode(self._ids, skip_special_tokens=False), final=True)
        else:
            self._pieces.close()


def generate_text(
    pte: str | os.PathLike,
    tokenizer: str | os.PathLike,
    prompt: str,
    shapes: DecoderShapes,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    on_text: Callable[[str], None] | None = None,
    seed: int = 0,
) -> Generation:
    """Generate up to ``max_new_tokens`` tokens after ``prompt`` from a :func:`~.export.lower_decoder` ``.pte``.

    ``temperature`` 0 is greedy; above it, tokens are drawn from the
    softmax of ``logits / temperature`` (seeded).  ``on_text`` receives the
    text as it comes, whole characters only.  Stops at the ``.pte``'s EOS ids.
    """
    import coreai_partitioner.verify as verify

    chunks: list[str] = []

    def emit(text: str) -> None:
        chunks.append(text)
        if on_text is not None:
            on_text(text)

    text = TokenText(tokenizer, emit)
    ids = text.encode(prompt)
    if not ids:
        raise ValueError("the prompt encodes to no tokens; give some text")
    prefill_calls(ids + [0] * max(max_new_tokens - 1, 0), 0, shapes)  # raises if it cannot fit the context
    generator = torch.Generator().manual_seed(seed)

    def pick(logits: torch.Tensor) -> int:
        if temperature <= 0:
            return int(logits.argmax())
        return int(torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=generator))

    def forward(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return verify.run(pte, tokens, positions)[0]

    generated: list[int] = []
    with NativeStreams():  # the runtime's own log lines; the text still reaches on_text
        eos = set(eos_ids_of(pte))
        started = time.perf_counter()
        logits = prefill(pte, ids, shapes)
        prompt_seconds = time.perf_counter() - started
        started = time.perf_counter()
        for token in decode_tokens(forward, logits, len(ids), max_new_tokens, eos, pick):
            generated.append(token)
            if token not in eos:
                text.feed(token)
        text.close()
    return Generation("".join(chunks), len(ids), len(generated), prompt_seconds, time.perf_counter() - started)


def runner_shapes(pte: Any, data_path: Any = None) -> DecoderShapes:
    """The :class:`~.export.DecoderShapes` a ``.pte`` was built for, read from its runner metadata (and its methods:
    the device form's static layout has ``prefill``; ``get_verify_len`` the ``verify`` method's length)."""
    import coreai_partitioner.verify as verify

    def value(name: str) -> int | None:
        try:
            return int(verify.run(pte, method=name, data_path=data_path)[0])
        except verify.UnsupportedProgram:
            return None

    context, chunk, verify_len = value("get_max_context_len"), value("get_max_seq_len"), value("get_verify_len") or 0
    if chunk is None or context is None:
        raise verify.UnsupportedProgram(f"{pte} has no get_max_seq_len/get_max_context_len: not an LLM runner's .pte")
    if bool(value("enable_dynamic_shape")):  # the host form's dynamic T, or the device form's bounded T: the same calls
        return DecoderShapes(context, chunk, "dynamic", verify_len=verify_len)
    if isinstance(pte, (str, os.PathLike)) and "prefill" in verify.method_names(pte, data_path):
        return DecoderShapes(context, chunk, target="device", device_shapes="static", verify_len=verify_len)
    return DecoderShapes(context, chunk, "enumerated", verify_len=0)
