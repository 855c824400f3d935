"""A lowered decoder against its fp32 model: its logits' SNR and PSNR, and its greedy tokens, near-ties allowed.

What ``export-llm --verify`` runs, in two halves, so that the fp32 model can
be gone before the model to export is loaded:

1. :func:`reference` takes the fp32 model's greedy continuation of a seeded
   random prompt (up to its own EOS, as ``generate`` stops) and its logits
   at every position that continuation is read from.
2. :func:`check` feeds the program the same tokens as ExecuTorch's runner
   would (the prompt in one call, then the reference's tokens one a call)
   and judges its logits at those positions with
   :mod:`coreai_partitioner.verify.fidelity`: the centered logits' SNR and PSNR
   against the threshold of the dtype and quantization scheme it was
   lowered with, and at each step its top-1, the token greedy decoding
   picks there, against the reference's next token.  The two may differ
   only where the reference's top two logits are closer than the
   threshold's tie margin.

Feeding the reference's tokens rather than the program's own keeps every
step comparable: one near-tie does not turn the rest of the continuation
into another text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner.verify import fidelity
from coreai_partitioner.llm.export import DecoderShapes
from coreai_partitioner.llm.generate import prefill

#: Tokens of the random prompt (dynamic shapes; enumerated shapes take a whole chunk) and greedy tokens compared.
PROMPT_TOKENS = 8
NEW_TOKENS = 8


@dataclass(frozen=True)
class Reference:
    """What the fp32 model says over the verify prompt: its greedy tokens and its logits where they are read."""

    prompt: list[int]
    tokens: list[int]  # greedy new tokens; the last may be an EOS id
    logits: torch.Tensor  # [positions, vocab]: the prompt's last position (all of them with full_logits), then each step's
    full_logits: bool

    @property
    def prompt_positions(self) -> int:
        """Rows of :attr:`logits` that the prompt's call returns."""
        return len(self.prompt) if self.full_logits else 1


def reference(
    model: torch.nn.Module,
    shapes: DecoderShapes,
    *,
    full_logits: bool = False,
    prompt_tokens: int = PROMPT_TOKENS,
    new_tokens: int = NEW_TOKENS,
    seed: int = 1,
    following: Reference | None = None,
) -> Reference:
    """The :class:`Reference` of the fp32 Hugging Face ``model`` for a program lowered with ``shapes``.

    ``following`` reads another reference's prompt and tokens instead of
    this model's own greedy ones: another model's logits over the same text.
    """
    if following is not None:
        prompt, tokens = torch.tensor([following.prompt]), list(following.tokens)
    else:
        vocab = model.config.get_text_config().vocab_size
        length = min(shapes.prefill_chunk, prompt_tokens) if shapes.mode == "dynamic" else shapes.prefill_chunk
        prompt = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))
        generation = model.generation_config
        eos = generation.eos_token_id
        pad = generation.pad_token_id if generation.pad_token_id is not None else (eos if isinstance(eos, int) else 0)
        with torch.no_grad():
            tokens = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)[0, length:].tolist()
    length = prompt.shape[1]
    with torch.no_grad():
        logits = model(torch.cat([prompt, torch.tensor([tokens[:-1]], dtype=prompt.dtype)], 1)).logits[0].float()
    return Reference(prompt[0].tolist(), tokens, logits if full_logits else logits[length - 1 :], full_logits)


def program_logits(program: Any, reference: Reference, shapes: DecoderShapes) -> torch.Tensor:
    """The program's logits where :attr:`Reference.logits` are: the prompt from an empty cache, then the
    reference's tokens one a call.  ``program`` is what ``verify.run`` takes."""
    from coreai_partitioner import verify

    rows = [prefill(program, reference.prompt, shapes)[0]]
    position = len(reference.prompt)
    for token in reference.tokens[:-1]:
        (logits,) = verify.run(program, torch.tensor([[token]]), torch.tensor([position]))
        rows.append(logits[0])
        position += 1
    return torch.cat(rows)


@dataclass(frozen=True)
class DecoderReport:
    """A lowered decoder's logits and greedy tokens against its fp32 model."""

    reference: Reference
    picked: list[int]  # the program's top-1 where each reference token was picked
    signal: fidelity.SignalReport

    @property
    def ok(self) -> bool:
        return self.signal.ok

    def __str__(self) -> str:
        ref = self.reference
        which = "every position's" if ref.full_logits else "the last position's"
        steps = len(ref.tokens) - 1
        lines = [
            f"verify: a random prompt of {len(ref.prompt)} tokens in one call, then the fp32 model's {steps} greedy "
            f"token(s) one a call; {which} logits against the fp32 model:",
            str(self.signal),
            f"\ngreedy tokens (each step's top-1, the fp32 model's tokens fed back):\n  .pte : {self.picked}\n  fp32 : {ref.tokens}",
        ]
        differ = [i for i, (a, b) in enumerate(zip(self.picked, ref.tokens)) if a != b]
        if not differ:
            lines.append("  same")
        else:
            margins = fidelity.tie_margins(ref.logits[ref.prompt_positions - 1 :])
            tie = self.signal.outputs[0].threshold.tie if self.signal.outputs else 0.0
            for step in differ:
                margin = float(margins[step])
                verdict = "a near-tie, allowed" if margin < tie else "NOT a near-tie"
                lines.append(
                    f"  step {step}: fp32's top two are {margin:.3g} standard deviations apart "
                    f"({verdict}: ties are below {tie:g})"
                )
        return "\n".join(lines)

    def raise_for_mismatch(self) -> None:
        if not self.ok:
            raise AssertionError("the lowered decoder is not close enough to its fp32 model:\n" + str(self))


def judge(
    actual: torch.Tensor,
    reference: Reference,
    *,
    dtype: torch.dtype | str = torch.float32,
    quantize: str | None = None,
    threshold: fidelity.Threshold | None = None,
) -> DecoderReport:
    """:class:`DecoderReport` of a program's :func:`program_logits` against ``reference``.

    ``dtype`` and ``quantize`` are what the program was lowered with; they
    pick the threshold (:func:`coreai_partitioner.verify.fidelity.threshold_for`)
    unless ``threshold`` is given.
    """
    if threshold is None:
        threshold = fidelity.threshold_for(dtype, quantize)
    signal = fidelity.compare(
        [actual], [reference.logits], threshold, logits=True, precision=fidelity.precision_name(dtype, quantize)
    )
    picked = actual[reference.prompt_positions - 1 :].argmax(-1).tolist()
    return DecoderReport(reference, picked, signal)


def check(
    program: Any,
    reference: Reference,
    shapes: DecoderShapes,
    *,
    dtype: torch.dtype | str = torch.float32,
    quantize: str | None = None,
    threshold: fidelity.Threshold | None = None,
) -> DecoderReport:
    """Run ``program`` (a :func:`~.export.lower_decoder` result, its ``.pte``) from an empty cache over
    ``reference``'s tokens and :func:`judge` it."""
    return judge(program_logits(program, reference, shapes), reference, dtype=dtype, quantize=quantize, threshold=threshold)
