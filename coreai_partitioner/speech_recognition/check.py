"""A speech ``.pte`` against the Hugging Face model it was lowered from: the encoder's output, the first logits, the
greedy ids.

What ``export --verify`` runs for a speech checkpoint, in two halves so the
fp32 model can be gone before the model to export is loaded:

1. :func:`reference` runs a Hugging Face model on one utterance: its
   cross-attention keys and values as its own ``EncoderDecoderCache`` holds
   them (in the layout of ``encoder``'s output), its logits after the decoder
   prompt, and ``generate``'s greedy ids (the language and task given, no
   timestamps, its own logits processors).  Once of the fp32 model, and once
   more of the model at the dtype it is lowered at, when that is not fp32.
2. :func:`check` runs the ``.pte`` (:class:`~.transcribe.SpeechProgram`) on
   the same features and judges it against the eager model it was lowered
   from, as every encoder-decoder's is judged (:mod:`coreai_partitioner.seq2seq.check`):
   the encoder's output and the logits by SNR, the greedy ids in fp32.
"""

from __future__ import annotations

from typing import Any

import torch

from coreai_partitioner.seq2seq.check import Seq2SeqReference, Seq2SeqReport, check, program_logits
from coreai_partitioner.seq2seq.decode import DecodingRules

__all__ = ["Seq2SeqReference", "Seq2SeqReport", "check", "generate_options", "program_logits", "reference"]


def generate_options(generation: Any, language: str | None, task: str) -> dict[str, Any]:
    """``generate``'s keywords for ``language`` and ``task``: a multilingual model's only (an English-only one refuses them)."""
    if getattr(generation, "is_multilingual", False) and getattr(generation, "lang_to_id", None):
        return {"language": language, "task": task}
    return {}


def reference(
    model: torch.nn.Module, features: torch.Tensor, *, language: str | None = "en", task: str = "transcribe",
    max_new_tokens: int | None = None,
) -> Seq2SeqReference:
    """:class:`~coreai_partitioner.seq2seq.check.Seq2SeqReference` of a ``WhisperForConditionalGeneration`` (at its dtype) on ``features``."""
    from coreai_partitioner.verify.fidelity import width_of

    rules = DecodingRules.of(model.generation_config, language=language, task=task)
    prompt = list(rules.prompt)
    encoder_dtype = model.model.encoder.conv1.weight.dtype
    features = features.to(encoder_dtype)
    with torch.no_grad():
        options = generate_options(model.generation_config, language, task)
        if max_new_tokens is not None:
            options["max_new_tokens"] = max_new_tokens
        ids = model.generate(features, **options)[0].tolist()
        if ids[: len(prompt)] == prompt:
            ids = ids[len(prompt) :]
        while ids and ids[-1] in rules.eos_ids:
            ids = ids[:-1]
        states = model.model.encoder(features).last_hidden_state
        out = model(encoder_outputs=(states,), decoder_input_ids=torch.tensor([prompt + ids]), use_cache=True)
        cache = out.past_key_values.cross_attention_cache
        cross = torch.cat([torch.cat([layer.keys, layer.values], dim=1) for layer in cache.layers], dim=1)
    config = model.config
    width = max(width_of(model), config.max_source_positions)
    depth = config.encoder_layers + config.decoder_layers + 1
    logits = out.logits[0, len(prompt) - 1 :].float()
    dtype = model.model.decoder.embed_tokens.weight.dtype
    return Seq2SeqReference(features.float(), cross.float(), logits, ids, rules, dtype, width, depth, encoder_dtype)
