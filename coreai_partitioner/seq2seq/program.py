"""An encoder-decoder ``.pte`` in ExecuTorch's runtime: ``encoder`` once, then ``text_decoder`` a token a call."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.seq2seq.decode import Decoded, DecodingRules, decode


class Seq2SeqProgram:
    """A ``.pte`` with methods ``encoder`` and ``text_decoder``, loaded in ExecuTorch's runtime (Core AI delegates on
    this package's host backend), as ExecuTorch's ASR runner and optimum's ``ExecuTorchModelForSeq2SeqLM`` call it.

    ``directory`` (default: the ``.pte``'s) holds what the export wrote beside it.
    """

    #: What the error for a ``.pte`` without the methods tells to export.
    EXPORT = "an encoder-decoder checkpoint (python -m coreai_partitioner export --checkpoint DIR)"

    def __init__(self, pte: str | os.PathLike, directory: str | os.PathLike | None = None) -> None:
        from coreai_partitioner.backends.apple_coreai.runtime import host

        self.path = Path(pte)
        self.directory = Path(directory) if directory is not None else self.path.parent
        self.program = host.load_program(self.path)
        missing = {"encoder", "text_decoder"} - set(self.program.method_names)
        if missing:
            raise ValueError(
                f"{self.path}: no method {', '.join(sorted(missing))}; it has {', '.join(sorted(self.program.method_names))}: "
                f"export {self.EXPORT}"
            )
        self._encoder = self.program.load_method("encoder")
        self._decoder = self.program.load_method("text_decoder")
        self.max_decode_len = int(self.constant("get_max_seq_len"))

    def constant(self, name: str) -> Any:
        """A constant method's value (``decoder_start_token_id``, ...); a list's values as a tuple (``get_eos_ids``)."""
        values = tuple(self.program.load_method(name).execute([]))
        return values[0] if len(values) == 1 else values

    def encoder(self, inputs: torch.Tensor) -> torch.Tensor:
        (cross,) = self._encoder.execute([inputs])
        return cross.clone()  # the method's own output memory is reused by its next call

    def text_decoder(self, ids: torch.Tensor, cross: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        (logits,) = self._decoder.execute([ids, cross, cache_position])
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
