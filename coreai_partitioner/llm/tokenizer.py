"""The tokenizer a ``.pte`` ships with, as ExecuTorch's LLM runner loads it.

ExecuTorch's runner (``extension/llm/runner``, ``load_tokenizer``) tries a
file as a Hugging Face ``tokenizer.json`` (BPE models), then tiktoken, then
SentencePiece, then llama2c, with the ``pytorch_tokenizers`` C++ classes
the Python package binds.  :func:`find` picks what a checkpoint has
(``tokenizer.json`` first, then ``tokenizer.model`` or a ``*.tiktoken``
file) and :func:`check` loads it with the same classes in the same order,
so a tokenizer the runner cannot read is refused before any export work,
with what the loader said.  :func:`copy` writes it beside the ``.pte`` with
``tokenizer_config.json``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: Tokenizer files by preference, as a checkpoint names them.
CANDIDATES = ("tokenizer.json", "tokenizer.model")
#: Files the runner's loaders read beside the tokenizer (special tokens, chat template, BOS/EOS).
COMPANIONS = ("tokenizer_config.json", "special_tokens_map.json")


class TokenizerError(ValueError):
    """A tokenizer ExecuTorch's runner cannot load; names the file, what the loader said, and the fix."""


@dataclass(frozen=True)
class Tokenizer:
    """A checkpoint's tokenizer file and the kind ExecuTorch's runner reads it as."""

    path: Path
    kind: str  # "huggingface", "tiktoken", "sentencepiece" or "llama2c"

    def describe(self) -> str:
        return f"{self.path.name} ({self.kind})"


def find(checkpoint: str | os.PathLike) -> Path | None:
    """The tokenizer file of a checkpoint directory, or ``None`` if it has none."""
    directory = Path(checkpoint)
    for name in CANDIDATES:
        if (directory / name).is_file():
            return directory / name
    tiktoken = sorted(directory.glob("*.tiktoken"))
    return tiktoken[0] if tiktoken else None


def _loaders() -> list[tuple[str, type]]:
    import pytorch_tokenizers as p

    return [
        ("huggingface", p.CppHFTokenizer),
        ("tiktoken", p.CppTiktoken),
        ("sentencepiece", p.CppSPTokenizer),
        ("llama2c", p.CppLlama2cTokenizer),
    ]


@contextmanager
def _native_stderr():
    """The C++ loaders' error lines, read back from file descriptor 2 (they write there, not to Python)."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    captured = tempfile.TemporaryFile(mode="w+b")
    os.dup2(captured.fileno(), 2)
    lines: list[str] = []
    try:
        yield lines
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        captured.seek(0)
        lines += [line for line in captured.read().decode(errors="replace").splitlines() if line.strip()]
        captured.close()


def check(path: str | os.PathLike) -> Tokenizer:
    """Load ``path`` as ExecuTorch's runner would; returns what it loaded as, raises :class:`TokenizerError`."""
    path = Path(path)
    if not path.is_file():
        raise TokenizerError(f"{path}: no such tokenizer file")
    with _native_stderr() as said:
        for kind, loader in _loaders():
            try:
                tokenizer = loader()
                tokenizer.load(str(path))
            except RuntimeError:
                continue
            if tokenizer.is_loaded():
                return Tokenizer(path, kind)
    reasons = "; ".join(line.split("] ", 1)[-1] for line in said if not line.startswith("I ")) or "no loader accepted it"
    raise TokenizerError(
        f"{path}: ExecuTorch's LLM runner cannot load this tokenizer (it tries Hugging Face BPE tokenizer.json, "
        f"tiktoken, SentencePiece and llama2c; they said: {reasons}). Give the checkpoint a tokenizer.json with a "
        "BPE model, a SentencePiece or tiktoken tokenizer.model, or export with --no-tokenizer"
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
