"""An encoder-decoder ``.pte`` against the Hugging Face model it was lowered from: the encoder's output, the logits,
the greedy ids.

A task's own ``reference`` runs its Hugging Face model on one input (its
cross-attention keys and values as its own ``EncoderDecoderCache`` holds
them, in the layout of ``encoder``'s output; its logits after the decoder
prompt and after each of ``generate``'s ids; ``generate``'s greedy ids) into
a :class:`Seq2SeqReference`.  :func:`check` runs the ``.pte``
(:class:`~.program.Seq2SeqProgram`) on the same input and judges it against
the eager model it was lowered from: the encoder's output, and the logits
after the decoder prompt and after each of ``generate``'s ids fed back, by
SNR at the runtime's own tolerance for that dtype and the model's shape
(:func:`coreai_partitioner.verify.fidelity.runtime_threshold`), each step's
top-1 the eager model's but at a near-tie.  In fp32 its greedy ids
(:func:`~.decode.decode`) must be ``generate``'s too; in a lower precision a
near-tie may turn a free-running greedy path, so there they are a report.
Its distance from the fp32 model is reported beside it, not judged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from coreai_partitioner.seq2seq.decode import DecodingRules, decode
from coreai_partitioner.seq2seq.program import Seq2SeqProgram
from coreai_partitioner.verify import fidelity


@dataclass(frozen=True)
class Seq2SeqReference:
    """A model on one input: what ``encoder``, the ``text_decoder`` logits and greedy decoding give."""

    inputs: torch.Tensor  # encoder's: features [1, n_mels, frames], token ids [1, T]
    cross: torch.Tensor  # HF's cross-attention keys then values per layer: [1, 2 * layers * heads, frames, head_dim]
    logits: torch.Tensor  # [len(ids) + 1, vocab]: after the decoder prompt, then after each of ids
    ids: list[int]  # generate's tokens after the prompt, EOS left out
    rules: DecodingRules
    dtype: torch.dtype  # the model's decoder's
    width: int  # the longest reduction of its matmuls: its widest Linear's inputs, or attention over the frames
    depth: int  # the stages whose rounding adds up: the encoder's and decoder's layers and the output projection
    encoder_dtype: torch.dtype | None = None  # what runs in encoder, when not at dtype (speech_recognition.at_precision)

    @property
    def precision(self) -> str:
        """``"fp16"``, or ``"fp16, encoder fp32"`` for a model whose encoder is wider."""
        encoder = "" if self.encoder_dtype in (None, self.dtype) else f", encoder {fidelity.precision_name(self.encoder_dtype)}"
        return fidelity.precision_name(self.dtype) + encoder

    @property
    def narrowest(self) -> torch.dtype:
        """The narrowest dtype the model computes in: its decoder's or its encoder's."""
        return min(filter(None, (self.dtype, self.encoder_dtype)), key=lambda dtype: torch.finfo(dtype).bits)

    def threshold(self, dtype: torch.dtype | str) -> fidelity.Threshold:
        """The runtime's tolerance for a program of this model at ``dtype`` (:func:`fidelity.runtime_threshold`)."""
        return fidelity.runtime_threshold(dtype, width=self.width, depth=self.depth)


def program_logits(program: Seq2SeqProgram, cross: torch.Tensor, rules: DecodingRules, ids: list[int]) -> torch.Tensor:
    """The program's ``text_decoder`` logits after the decoder prompt and after each of ``ids`` fed back
    (teacher-forced), where :attr:`Seq2SeqReference.logits` are: the prompt a token a call from position 0, then
    ``ids`` one a call.  ``[len(ids) + 1, vocab]``."""
    rows = []
    for position, token in enumerate(list(rules.prompt) + ids):
        logits = program.text_decoder(torch.tensor([[token]]), cross, torch.tensor([position]))[0, -1]
        if position >= len(rules.prompt) - 1:
            rows.append(logits.float())
    return torch.stack(rows)


@dataclass(frozen=True)
class Seq2SeqReport:
    """An encoder-decoder ``.pte`` against the eager model it was lowered from (:attr:`eager`), the fp32 model's beside it."""

    reference: Seq2SeqReference  # the fp32 model's
    eager: Seq2SeqReference  # the model's at the dtype the program was lowered at (the fp32 model's at fp32)
    signal: fidelity.SignalReport  # against eager: output 0 encoder's output, output 1 the logits at each step
    quality: fidelity.Quality  # the logits against the fp32 model's: a report
    ids: list[int]  # the program's own greedy ids
    precision: str

    #: What :attr:`ok` judges the program against, in a sentence (``--verify`` names it when the .pte falls short).
    against = "the Hugging Face model it was lowered from"

    @property
    def same_ids(self) -> bool:
        return self.ids == self.eager.ids

    @property
    def ok(self) -> bool:
        return self.signal.ok and (self.same_ids or self.precision != "fp32")

    def __str__(self) -> str:
        at = self.eager.precision
        decides = "" if self.precision == "fp32" else " (a report: the logits above decide)"
        label = len(f"HF {at}")
        lines = [
            "verify: output 0 is encoder's (the cross-attention keys and values) against Hugging Face's own, output 1 "
            f"text_decoder's logits after the decoder prompt and after each of generate's ids, both of the {at} model:",
            str(self.signal),
            f"\ngreedy ids (HF generate's rules: {len(self.reference.rules.suppress)} suppressed tokens, "
            f"{len(self.reference.rules.begin_suppress)} at the first){decides}:",
            f"  {'.pte':<{label}} : {self.ids}",
            f"  {'HF ' + at:<{label}} : {self.eager.ids}",
            "  same" if self.same_ids else "  different",
        ]
        if self.eager is not self.reference:
            lines.append(f"  {'HF fp32':<{label}} : {self.reference.ids} (a report)")
        lines.append(f"logits against the fp32 model's (a report): {self.quality}")
        return "\n".join(lines)

    def raise_for_mismatch(self) -> None:
        if not self.ok:
            raise AssertionError(f"the .pte is not close enough to {self.against}:\n" + str(self))


def check(
    program: Seq2SeqProgram,
    reference: Seq2SeqReference,
    *,
    eager: Seq2SeqReference | None = None,
    dtype: torch.dtype | str = torch.float32,
    threshold: fidelity.Threshold | None = None,
    max_new_tokens: int | None = None,
) -> Seq2SeqReport:
    """Run ``program`` on the reference's input and judge it (see the module).

    ``reference`` is the fp32 model's; ``eager`` the model's it was lowered
    from (its task's ``reference`` of it), which a program at another ``dtype``
    needs.  The tolerance is the runtime's at ``dtype``, or at the narrowest
    dtype ``eager`` computes in (an encoder may be narrower than its
    decoder, :func:`coreai_partitioner.speech_recognition.at_precision`), unless ``threshold`` is given.
    """
    eager = fidelity.against(eager, reference, dtype, how="reference() of the model at its dtype")
    if eager is not reference:  # the tolerance of the narrowest arithmetic in the program (an encoder may be narrower)
        dtype = eager.narrowest
    precision = fidelity.precision_name(dtype)
    threshold = threshold or reference.threshold(dtype)
    cross = program.encoder(eager.inputs)
    logits = program_logits(program, cross, eager.rules, eager.ids)
    decoded = decode(program.text_decoder, cross, eager.rules, max_decode_len=program.max_decode_len,
                     max_new_tokens=max_new_tokens)
    arithmetic = fidelity.arithmetic(dtype, width=reference.width, depth=reference.depth)
    encoder_report = fidelity.compare([cross.float()], [eager.cross], threshold, precision=arithmetic)
    logits_report = fidelity.compare([logits], [eager.logits], threshold, logits=True)
    rows = (encoder_report.outputs[0], dataclasses.replace(logits_report.outputs[0], index=1))
    signal = fidelity.SignalReport(rows, encoder_report.note or logits_report.note, encoder_report.precision)
    shared = min(len(logits), len(reference.logits))  # the fp32 model's ids may run longer or shorter
    quality = fidelity.quality(logits[:shared], reference.logits[:shared])
    return Seq2SeqReport(reference, eager, signal, quality, decoded.ids, precision)
