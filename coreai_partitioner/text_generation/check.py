"""A lowered decoder against the eager model it was lowered from (the check), and against the fp32 model (a report).

What ``export-llm --verify`` runs, in parts, so that the fp32 model can be
gone before the model to export is loaded:

1. :func:`reference` takes the fp32 model's greedy continuation of a seeded
   random prompt (up to its own EOS, as ``generate`` stops) and its logits
   at every position that continuation is read from.
2. :func:`eager_logits` runs the eager model the program was lowered from
   over the same tokens: the model at the program's dtype, or, for a
   quantization scheme, the quantized eager model (``lower_decoder``'s
   ``quantized_reference=``), whose weights are the ones the program stores.
3. :func:`check` feeds the program the same tokens as ExecuTorch's runner
   would (the prompt in one call, then the reference's tokens one a call)
   and judges its logits against the eager model's with
   :mod:`coreai_partitioner.verify.fidelity`: the centered logits' SNR
   against the tolerance of the runtime's own arithmetic at the program's
   dtype (``runtime_threshold``: the unit roundoff, the model's widest
   reduction and its depth), and each step's top-1 against the eager
   model's, which may differ only where the eager model's top two logits
   are closer than the noise that tolerance allows.  How far the program is
   from the fp32 model (what fp16 or the scheme costs) is reported beside
   it, and decides nothing.

Feeding the reference's tokens rather than the program's own keeps every
step comparable: one near-tie does not turn the rest of the continuation
into another text.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner.quantize.weight_forms import expand_weights
from coreai_partitioner.verify import fidelity
from coreai_partitioner.verify.fidelity import width_of
from coreai_partitioner.text_decoder.decoder import reset_state
from coreai_partitioner.text_decoder.shapes import DecoderShapes
from coreai_partitioner.text_generation.generate import prefill, prefill_calls

#: Tokens of the random prompt (dynamic shapes; enumerated shapes take a whole chunk) and greedy tokens compared.
PROMPT_TOKENS = 8
NEW_TOKENS = 8


@dataclass(frozen=True)
class Reference:
    """What the fp32 model says over the verify prompt: its greedy tokens and its logits where they are read,
    and the shape the runtime's tolerance is taken from."""

    prompt: list[int]
    tokens: list[int]  # greedy new tokens; the last may be an EOS id
    logits: torch.Tensor  # [positions, vocab]: the prompt's last position (all of them with full_logits), then each step's
    full_logits: bool
    width: int  # the longest reduction of the model's matmuls (its widest Linear's inputs)
    depth: int  # the stages whose rounding adds up: its layers and the lm_head

    @property
    def prompt_positions(self) -> int:
        """Rows of :attr:`logits` that the prompt's call returns."""
        return len(self.prompt) if self.full_logits else 1

    def threshold(self, dtype: torch.dtype | str) -> fidelity.Threshold:
        """The runtime's tolerance for a program of this model at ``dtype`` (:func:`fidelity.runtime_threshold`)."""
        return fidelity.runtime_threshold(dtype, width=self.width, depth=self.depth)


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
    depth = model.config.get_text_config().num_hidden_layers + 1
    return Reference(
        prompt[0].tolist(), tokens, logits if full_logits else logits[length - 1 :], full_logits, width_of(model), depth
    )


def program_logits(program: Any, reference: Reference, shapes: DecoderShapes) -> torch.Tensor:
    """The program's logits where :attr:`Reference.logits` are: the prompt from an empty cache, then the
    reference's tokens one a call.  ``program`` is what ``verify.run`` takes."""
    import coreai_partitioner.verify as verify

    rows = [prefill(program, reference.prompt, shapes)[0]]
    position = len(reference.prompt)
    for token in reference.tokens[:-1]:
        (logits,) = verify.run(program, torch.tensor([[token]]), torch.tensor([position]))
        rows.append(logits[0])
        position += 1
    return torch.cat(rows)


def eager_logits(
    model: torch.nn.Module, reference: Reference, shapes: DecoderShapes, *, expanded: bool = True
) -> torch.Tensor:
    """An eager model's logits where :attr:`Reference.logits` are, in float32.

    ``model`` is a Hugging Face causal LM, at the dtype the program was
    lowered at (one call over the whole text), or a decoder step
    ``(tokens, input_pos) -> logits`` whose caches are its buffers: the
    quantized eager model ``lower_decoder(..., quantized_reference=)``
    hands back, or :func:`~coreai_partitioner.text_decoder.recompose.adapt`'s decoder.  A step is fed from
    empty caches as the program is, the prompt a chunk a call (the device
    form's ``forward`` a token a call), then the reference's tokens one a call.
    A quantized program's weights are expanded once, in a copy of
    ``model`` (:func:`~coreai_partitioner.quantize.weight_forms.expand_weights`),
    not on every call; ``model`` is left as it was.  ``expanded=False`` leaves them compressed, each expanded when
    its op runs (the same numbers, slower; for weights that would not fit expanded).
    """
    text = reference.prompt + reference.tokens[:-1]
    with torch.no_grad():
        if hasattr(model, "generation_config"):
            logits = model(torch.tensor([text])).logits[0].float()
            return logits if reference.full_logits else logits[len(reference.prompt) - 1 :]
        if isinstance(model, torch.fx.GraphModule) and expanded:
            model = expand_weights(copy.deepcopy(model))
        reset_state(model)
        chunks = (
            [(torch.tensor([[t]]), torch.tensor([p])) for p, t in enumerate(reference.prompt)]
            if shapes.device
            else [(c, p) for c, p, _ in prefill_calls(reference.prompt, 0, dataclasses.replace(shapes, mode="dynamic"))]
        )
        prompt_rows = [model(tokens, positions)[0].float() for tokens, positions in chunks]
        rows = [torch.cat(prompt_rows) if reference.full_logits else prompt_rows[-1][-1:]]
        for position, token in enumerate(reference.tokens[:-1], start=len(reference.prompt)):
            rows.append(model(torch.tensor([[token]]), torch.tensor([position]))[0].float())
    return torch.cat(rows)


def stored_as(model: torch.nn.Module, shapes: DecoderShapes, kv_cache: str, full_logits: bool = False) -> torch.nn.Module:
    """``model``'s decoder (a ``PeftModel``'s base, its adapter active) with its KV caches stored as ``kv_cache`` says:
    what a program with int8 caches is judged against (they move the logits past the runtime's rounding)."""
    from coreai_partitioner.blocks.quantized_cache import quantize_kv_caches
    from coreai_partitioner.text_decoder import adapt

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return quantize_kv_caches(adapt(base, shapes, full_logits=full_logits), kv_cache)


@dataclass(frozen=True)
class DecoderReport:
    """A lowered decoder's logits against the eager model it was lowered from (the check) and the fp32 model."""

    reference: Reference
    picked: list[int]  # the program's top-1 where each reference token was picked
    eager_picked: list[int]  # the eager model's
    signal: fidelity.SignalReport  # against the eager model: decides
    quality: fidelity.Quality  # against the fp32 model: a report
    against: str  # what the eager model was

    @property
    def ok(self) -> bool:
        return self.signal.ok

    def __str__(self) -> str:
        ref = self.reference
        which = "every position's" if ref.full_logits else "the last position's"
        steps = len(ref.tokens) - 1
        lines = [
            f"verify: a random prompt of {len(ref.prompt)} tokens in one call, then the fp32 model's {steps} greedy "
            f"token(s) one a call; {which} logits against {self.against} (the check):",
            str(self.signal),
            f"\nagainst the fp32 model (what the precision costs; a report, not a check): {self.quality}",
            f"\ngreedy tokens (each step's top-1, the fp32 model's tokens fed back):\n  .pte : {self.picked}\n"
            f"  eager: {self.eager_picked}\n  fp32 : {ref.tokens}",
        ]
        differ = [i for i, (a, b) in enumerate(zip(self.picked, self.eager_picked)) if a != b]
        if not differ:
            lines.append("  the .pte's are the eager model's")
        else:
            eager = self.signal.outputs[0] if self.signal.outputs else None
            tie = eager.threshold.tie if eager is not None else 0.0
            for step in differ:
                lines.append(f"  step {step}: the .pte's top-1 is not the eager model's (ties are below {tie:.3g} "
                             "standard deviations of the eager model's logits)")
        return "\n".join(lines)

    def raise_for_mismatch(self) -> None:
        if not self.ok:
            raise AssertionError(f"the lowered decoder is not close enough to {self.against}:\n" + str(self))


def judge(
    actual: torch.Tensor,
    reference: Reference,
    *,
    eager: torch.Tensor | None = None,
    dtype: torch.dtype | str = torch.float32,
    quantize: str | None = None,
    threshold: fidelity.Threshold | None = None,
) -> DecoderReport:
    """:class:`DecoderReport` of a program's :func:`program_logits` against ``eager`` (:func:`eager_logits` of the
    model it was lowered from) and ``reference`` (the fp32 model).

    ``dtype`` and ``quantize`` are what the program was lowered with.  An
    fp32 program of the fp32 model may leave out ``eager``: the reference's
    logits are its eager model's.  The tolerance is the runtime's at
    ``dtype`` (:meth:`Reference.threshold`) unless ``threshold`` is given.
    """
    precision = fidelity.precision_name(dtype, quantize)
    how = "eager_logits of the model at its dtype, or of lower_decoder's quantized_reference"
    eager = fidelity.against(eager, reference.logits, dtype, quantize, how=how)
    if threshold is None:
        threshold = reference.threshold(dtype)
    arithmetic = fidelity.arithmetic(dtype, width=reference.width, depth=reference.depth)
    signal = fidelity.compare([actual], [eager], threshold, logits=True, precision=arithmetic)
    quality = fidelity.quality(actual, reference.logits)
    start = reference.prompt_positions - 1
    against = ("the quantized eager model" if quantize else "the eager model") + f" ({precision})"
    return DecoderReport(reference, actual[start:].argmax(-1).tolist(), eager[start:].argmax(-1).tolist(), signal, quality, against)


def check(
    program: Any,
    reference: Reference,
    shapes: DecoderShapes,
    *,
    eager: torch.Tensor | None = None,
    dtype: torch.dtype | str = torch.float32,
    quantize: str | None = None,
    threshold: fidelity.Threshold | None = None,
) -> DecoderReport:
    """Run ``program`` (a :func:`~.export.lower_decoder` result, its ``.pte``) from an empty cache over
    ``reference``'s tokens and :func:`judge` it."""
    return judge(
        program_logits(program, reference, shapes), reference, eager=eager, dtype=dtype, quantize=quantize, threshold=threshold
    )
