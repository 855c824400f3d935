"""An encoder-decoder ``.pte`` in ExecuTorch's runtime: ``encoder`` once, then ``text_decoder`` a token a call."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.seq2seq.decode import Decoded, DecodingRules, decode
from coreai_partitioner.verify.program import LoadedProgram


class Seq2SeqProgram(LoadedProgram):
    """A ``.pte`` with methods ``encoder`` and ``text_decoder``, loaded in ExecuTorch's runtime (Core AI delegates on
    this package's host backend), as ExecuTorch's ASR runner and optimum's ``ExecuTorchModelForSeq2SeqLM`` call it.

    ``directory`` (default: the ``.pte``'s) holds what the export wrote beside it.
    """

    METHODS = ("encoder", "text_decoder")
    EXPORT = "an encoder-decoder checkpoint (python -m coreai_partitioner export --checkpoint DIR)"

    def __init__(self, pte: str | os.PathLike, directory: str | os.PathLike | None = None) -> None:
        super().__init__(pte)
        self.directory = Path(directory) if directory is not None else self.path.parent
        self.max_decode_len = int(self.constant("get_max_seq_len"))

    def encoder(self, inputs: torch.Tensor) -> torch.Tensor:
        (cross,) = self.methods["encoder"].execute([inputs])
        return cross.clone()  # the method's own output memory is reused by its next call

    def text_decoder(self, ids: torch.Tensor, cross: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        (logits,) = self.methods["text_decoder"].execute([ids, cross, cache_position])
        return logits

    def decode(self, inputs: torch.Tensor, rules: DecodingRules, **options: Any) -> Decoded:
        """``encoder`` then :func:`~.decode.decode` (``options`` are its), the encoder's call timed too."""
        started = time.perf_counter()
        cross = self.encoder(inputs)
        encoded = time.perf_counter() - started
        decoded = decode(self.text_decoder, cross, rules, max_decode_len=self.max_decode_len, **options)
        decoded.encoder_seconds = encoded
        return decoded

    def text(self, ids: list[int]) -> str:
        """``ids`` as text, through the ``tokenizer.json`` beside the ``.pte`` (special tokens left out)."""
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
        return tokenizer.decode(ids, skip_special_tokens=True).strip()
