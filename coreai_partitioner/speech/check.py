"""A speech ``.pte`` against Hugging Face eager in fp32: the encoder's output, the first logits, the greedy ids.

What ``export --verify`` runs for a speech checkpoint, in two halves so the
fp32 model can be gone before the model to export is loaded:

1. :func:`reference` runs the fp32 Hugging Face model on one utterance: its
   cross-attention keys and values as its own ``EncoderDecoderCache`` holds
   them (in the layout of ``encoder``'s output), its logits after the decoder
   prompt, and ``generate``'s greedy ids (the language and task given, no
   timestamps, its own logits processors).
2. :func:`check` runs the ``.pte`` (:class:`~.transcribe.SpeechProgram`) on
   the same features and judges the encoder's output and the first logits by
   SNR and PSNR (:mod:`coreai_partitioner.verify.fidelity`, the threshold of
   the dtype it was lowered with), and its greedy ids (:func:`~.transcribe.decode`)
   against ``generate``'s: they must be the same.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner.speech.transcribe import DecodingRules, SpeechProgram, decode
from coreai_partitioner.verify import fidelity


@dataclass(frozen=True)
class SpeechReference:
    """The fp32 model on one utterance: what ``encoder``, the first ``text_decoder`` logits and greedy decoding give."""

    features: torch.Tensor  # [1, n_mels, frames]
    cross: torch.Tensor  # HF's cross-attention keys then values per layer: [1, 2 * layers * heads, frames, head_dim]
    first_logits: torch.Tensor  # [vocab]: after the decoder prompt
    ids: list[int]  # generate's tokens after the prompt, EOS left out
    rules: DecodingRules


def generate_options(generation: Any, language: str | None, task: str) -> dict[str, Any]:
    """``generate``'s keywords for ``language`` and ``task``: a multilingual model's only (an English-only one refuses them)."""
    if getattr(generation, "is_multilingual", False) and getattr(generation, "lang_to_id", None):
        return {"language": language, "task": task}
    return {}


def reference(
    model: torch.nn.Module, features: torch.Tensor, *, language: str | None = "en", task: str = "transcribe",
    max_new_tokens: int | None = None,
) -> SpeechReference:
    """:class:`SpeechReference` of the fp32 ``WhisperForConditionalGeneration`` on ``features``."""
    rules = DecodingRules.of(model.generation_config, language=language, task=task)
    prompt = torch.tensor([list(rules.prompt)])
    with torch.no_grad():
        states = model.model.encoder(features).last_hidden_state
        out = model(encoder_outputs=(states,), decoder_input_ids=prompt, use_cache=True)
        cache = out.past_key_values.cross_attention_cache
        cross = torch.cat([torch.cat([layer.keys, layer.values], dim=1) for layer in cache.layers], dim=1)
        options = generate_options(model.generation_config, language, task)
        if max_new_tokens is not None:
            options["max_new_tokens"] = max_new_tokens
        ids = model.generate(features, **options)[0].tolist()
    if ids[: len(rules.prompt)] == list(rules.prompt):
        ids = ids[len(rules.prompt) :]
    while ids and ids[-1] in rules.eos_ids:
        ids = ids[:-1]
    return SpeechReference(features, cross.float(), out.logits[0, -1].float(), ids, rules)


@dataclass(frozen=True)
class SpeechReport:
    """A speech ``.pte`` against :class:`SpeechReference`."""

    reference: SpeechReference
    signal: fidelity.SignalReport  # output 0: encoder's output, output 1: the first logits
    ids: list[int]

    @property
    def same_ids(self) -> bool:
        return self.ids == self.reference.ids

    @property
    def ok(self) -> bool:
        return self.signal.ok and self.same_ids

    def __str__(self) -> str:
        lines = [
            "verify: output 0 is encoder's (the cross-attention keys and values) against Hugging Face's own, "
            "output 1 text_decoder's logits after the decoder prompt against HF eager's:",
            str(self.signal),
            f"\ngreedy ids (HF generate's rules: {len(self.reference.rules.suppress)} suppressed tokens, "
            f"{len(self.reference.rules.begin_suppress)} at the first):",
            f"  .pte : {self.ids}",
            f"  HF   : {self.reference.ids}",
            "  same" if self.same_ids else "  DIFFERENT",
        ]
        return "\n".join(lines)

    def raise_for_mismatch(self) -> None:
        if not self.ok:
            raise AssertionError("the speech .pte is not close enough to Hugging Face eager:\n" + str(self))


def check(
    program: SpeechProgram,
    reference: SpeechReference,
    *,
    dtype: torch.dtype | str = torch.float32,
    threshold: fidelity.Threshold | None = None,
    max_new_tokens: int | None = None,
) -> SpeechReport:
    """Run ``program`` on the reference's features and judge it (see the module)."""
    threshold = threshold or fidelity.threshold_for(dtype)
    cross = program.encoder(reference.features)
    decoded = decode(program.text_decoder, cross, reference.rules, max_decode_len=program.max_decode_len,
                     keep_logits=True, max_new_tokens=max_new_tokens)
    first = decoded.logits[0] if decoded.logits else torch.full_like(reference.first_logits, float("nan"))
    encoder_report = fidelity.compare([cross.float()], [reference.cross], threshold, precision=fidelity.precision_name(dtype))
    logits_report = fidelity.compare([first.unsqueeze(0)], [reference.first_logits.unsqueeze(0)], threshold, logits=True)
    rows = (encoder_report.outputs[0], dataclasses.replace(logits_report.outputs[0], index=1))
    signal = fidelity.SignalReport(rows, encoder_report.note or logits_report.note, encoder_report.precision)
    return SpeechReport(reference, signal, decoded.ids)
