"""The tokenizer a ``.pte`` ships with, as ExecuTorch's LLM runner loads it.

ExecuTorch's runner (``extension/llm/runner``, ``load_tokenizer``) tries a
file as a Hugging Face ``tokenizer.json`` (BPE models), then tiktoken, then
SentencePiece, then llama2c, with the ``pytorch_tokenizers`` C++ classes
the Python package binds.  :func:`find` picks what a checkpoint has
(``tokenizer.json`` first, then ``tokenizer.model``, T5's ``spiece.model`` or a
``*.tiktoken`` file) and :func:`check` loads it with the same classes in the
same order, so a tokenizer the runner cannot read is refused before any
export work, with what the loader said; :func:`choose` takes the first of a
checkpoint's files the runner reads (T5's ``tokenizer.json`` is a Unigram
model its Hugging Face loader does not read; its ``spiece.model`` is
SentencePiece, which it does).  :func:`copy` writes it beside the ``.pte`` with
``tokenizer_config.json`` and the chat template.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from coreai_partitioner.console import NativeStreams

#: Tokenizer files by preference, as a checkpoint names them (``spiece.model``: T5's SentencePiece model).
CANDIDATES = ("tokenizer.json", "tokenizer.model", "spiece.model")
#: Files beside the tokenizer: special tokens, BOS/EOS (the runner's loaders read them) and the chat template a
#: deployer's app renders a conversation with (transformers 5 writes it as chat_template.jinja).
COMPANIONS = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json")


class TokenizerError(ValueError):
    """A tokenizer ExecuTorch's runner cannot load; names the file, what the loader said, and the fix."""


@dataclass(frozen=True)
class Tokenizer:
    """A checkpoint's tokenizer file and the kind ExecuTorch's runner reads it as."""

    path: Path
    kind: str  # "huggingface", "tiktoken", "sentencepiece" or "llama2c"

    def describe(self) -> str:
        return f"{self.path.name} ({self.kind})"


def found(checkpoint: str | os.PathLike) -> list[Path]:
    """The tokenizer files of a checkpoint directory, by preference: :data:`CANDIDATES`, then ``*.tiktoken`` files."""
    directory = Path(checkpoint)
    return [directory / name for name in CANDIDATES if (directory / name).is_file()] + sorted(directory.glob("*.tiktoken"))


def find(checkpoint: str | os.PathLike) -> Path | None:
    """The tokenizer file of a checkpoint directory, or ``None`` if it has none."""
    files = found(checkpoint)
    return files[0] if files else None


def choose(checkpoint: str | os.PathLike) -> Tokenizer | None:
    """The first of a checkpoint's tokenizer files (:func:`found`) ExecuTorch's runner loads, checked; ``None`` when
    it has none; the first file's :class:`TokenizerError` when the runner loads none of them."""
    refused = None
    for path in found(checkpoint):
        try:
            return check(path)
        except TokenizerError as error:
            refused = refused or error
    if refused is not None:
        raise refused
    return None


def runner_loaders() -> list[tuple[str, type]]:
    """``(kind, pytorch_tokenizers class)`` in the order ExecuTorch's runner tries them."""
    with NativeStreams():  # importing it logs a line from C++
        import pytorch_tokenizers as p

    return [
        ("huggingface", p.CppHFTokenizer),
        ("tiktoken", p.CppTiktoken),
        ("sentencepiece", p.CppSPTokenizer),
        ("llama2c", p.CppLlama2cTokenizer),
    ]


def check(path: str | os.PathLike) -> Tokenizer:
    """Load ``path`` as ExecuTorch's runner would; returns what it loaded as, raises :class:`TokenizerError`."""
    path = Path(path)
    if not path.is_file():
        raise TokenizerError(f"{path}: no such tokenizer file")
    reasons = {}
    for kind, loader in runner_loaders():
        said = NativeStreams()  # the C++ loaders write their reasons to file descriptor 2
        with said:
            try:
                tokenizer = loader()
                tokenizer.load(str(path))
                loaded = tokenizer.is_loaded()
            except RuntimeError:
                loaded = False
        if loaded:
            return Tokenizer(path, kind)
        lines = [line.split("] ", 1)[-1].strip() for line in said.lines if not line.startswith("I ")]
        reasons[kind] = next((line for line in lines if line), "not loaded")
    if path.suffix == ".json":  # the other loaders are the runner's fallbacks for other formats
        reasons = {"huggingface": reasons["huggingface"]}
    said = "; ".join(f"{kind}: {reason}" for kind, reason in reasons.items())
    raise TokenizerError(
        f"{path}: ExecuTorch's LLM runner cannot load this tokenizer ({said}). It reads a tokenizer.json with a "
        "BPE model, a SentencePiece or tiktoken tokenizer.model; give the checkpoint one, or export with --no-tokenizer"
    )


def copy(tokenizer: Tokenizer, directory: str | os.PathLike) -> list[Path]:
    """Copy the tokenizer (under its own name) and its companions into ``directory``; returns the copies."""
    directory = Path(directory)
    written = []
    for source in [tokenizer.path, *(tokenizer.path.parent / name for name in COMPANIONS)]:
        if not source.is_file():
            continue
        target = directory / source.name
        if source.resolve() != target.resolve():
            shutil.copyfile(source, target)
        written.append(target)
    return written
