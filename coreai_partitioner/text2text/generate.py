"""A text2text ``.pte`` in ExecuTorch's runtime: text in, ``encoder`` once, ``text_decoder`` a token a call, text out.

ExecuTorch 1.5.1 has no runner for text-to-text models in C++ or Python
(its ASR runner feeds audio features); optimum-executorch's
``ExecuTorchModelForSeq2SeqLM`` calls the same two methods.
:class:`Text2TextProgram` is that loop on this package's host Core AI
backend: the input's token ids (``tokenizer.json`` beside the ``.pte``,
read by the ``tokenizers`` library; or ``spiece.model`` by SentencePiece),
``encoder(input_ids)``, then greedy decoding by Hugging Face's rules
(:class:`~coreai_partitioner.seq2seq.DecodingRules` of the
``generation_config.json`` beside it: T5's start token, its EOS,
``max_length``), the ids back to text.
"""

from __future__ import annotations

from typing import Any

import torch

from coreai_partitioner.seq2seq import Decoded, DecodingRules, Seq2SeqProgram
from coreai_partitioner.seq2seq.decode import GENERATION_FILE


class Text2TextProgram(Seq2SeqProgram):
    """A text2text ``.pte`` loaded in ExecuTorch's runtime (Core AI delegates on this package's host backend).

    ``directory`` (default: the ``.pte``'s) holds what the export wrote
    beside it: the tokenizer and ``generation_config.json``.
    """

    EXPORT = "a text2text-generation checkpoint (python -m coreai_partitioner export --checkpoint DIR)"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_input_len = int(self.constant("max_hidden_seq_length"))

    @property
    def rules(self) -> DecodingRules:
        """The greedy rules of ``generation_config.json`` beside the ``.pte``, or of its constant methods."""
        if (self.directory / GENERATION_FILE).is_file():
            return DecodingRules.read(self.directory)
        eos = self.constant("get_eos_ids")
        eos_ids = tuple(map(int, eos if isinstance(eos, tuple) else (eos,)))
        return DecodingRules(prompt=(int(self.constant("decoder_start_token_id")),), eos_ids=eos_ids)

    def tokens(self, text: str) -> list[int]:
        """``text`` as the model's input ids (its tokenizer ends them with ``</s>``)."""
        if (self.directory / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            return Tokenizer.from_file(str(self.directory / "tokenizer.json")).encode(text).ids
        import sentencepiece

        processor = sentencepiece.SentencePieceProcessor(model_file=str(self.directory / "spiece.model"))
        return processor.encode(text) + [processor.eos_id()]

    def text(self, ids: list[int]) -> str:
        """``ids`` as text (special tokens left out)."""
        if (self.directory / "tokenizer.json").is_file():
            return super().text(ids)
        import sentencepiece

        return sentencepiece.SentencePieceProcessor(model_file=str(self.directory / "spiece.model")).decode(ids).strip()

    def generate(self, input_ids: torch.Tensor, **options: Any) -> Decoded:
        """Greedy decoding of ``input_ids`` [1, T] (``options``: :func:`~coreai_partitioner.seq2seq.decode`'s)."""
        if not 1 <= input_ids.shape[1] <= self.max_input_len:
            raise ValueError(
                f"an input of {input_ids.shape[1]} tokens: {self.path.name} takes 1 to {self.max_input_len}; shorten it, "
                "or export with a longer --max-input-len"
            )
        return self.decode(input_ids, self.rules, **options)

    def answer(self, prompt: str, **options: Any) -> tuple[str, Decoded]:
        """``prompt``'s text through the model: the generated text and how it was decoded."""
        decoded = self.generate(torch.tensor([self.tokens(prompt)]), **options)
        return self.text(decoded.ids), decoded
