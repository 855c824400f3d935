"""A text2text ``.pte`` against the Hugging Face model it was lowered from (``export --verify``).

:func:`reference` runs a ``T5ForConditionalGeneration`` on one input into a
:class:`~coreai_partitioner.seq2seq.check.Seq2SeqReference`: its
cross-attention keys and values as its own ``EncoderDecoderCache`` holds
them (the layout of ``encoder``'s output), its logits after the decoder
start token and after each of ``generate``'s ids, and ``generate``'s greedy
ids.  :func:`~coreai_partitioner.seq2seq.check.check` judges the program
against it, as it judges a speech ``.pte``.
"""

from __future__ import annotations

import torch

from coreai_partitioner.seq2seq.check import Seq2SeqReference, check
from coreai_partitioner.seq2seq.decode import DecodingRules

__all__ = ["check", "reference"]


def reference(model: torch.nn.Module, input_ids: torch.Tensor, *, max_new_tokens: int | None = None) -> Seq2SeqReference:
    """:class:`~coreai_partitioner.seq2seq.check.Seq2SeqReference` of a T5 (at its dtype) on ``input_ids`` [1, T]."""
    from coreai_partitioner.verify.fidelity import width_of

    rules = DecodingRules.of(model.generation_config)
    prompt = list(rules.prompt)
    with torch.no_grad():
        options = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens, "max_length": None}
        ids = model.generate(input_ids, do_sample=False, num_beams=1, **options)[0].tolist()
        if ids[: len(prompt)] == prompt:
            ids = ids[len(prompt) :]
        while ids and ids[-1] in rules.eos_ids:
            ids = ids[:-1]
        out = model(input_ids=input_ids, decoder_input_ids=torch.tensor([prompt + ids]), use_cache=True)
        cache = out.past_key_values.cross_attention_cache
        cross = torch.cat([torch.cat([layer.keys, layer.values], dim=1) for layer in cache.layers], dim=1)
    config = model.config
    width = max(width_of(model), input_ids.shape[1])
    depth = config.num_layers + config.num_decoder_layers + 1
    logits = out.logits[0, len(prompt) - 1 :].float()
    dtype = model.decoder.embed_tokens.weight.dtype
    return Seq2SeqReference(input_ids, cross.float(), logits, ids, rules, dtype, width, depth)
