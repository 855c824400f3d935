"""optimum-executorch's ``text2text-generation`` task with the ``coreai`` recipe, on transformers 5.0.0rc1 (what it pins).

Run by ``tests/test_text2text.py`` with that transformers first on
``sys.path``.  Saves the tiny random Flan-T5 of ``coreai_partitioner.text2text.tiny``,
exports it through ``ExecuTorchModelForSeq2SeqLM.from_pretrained(dir,
recipe="coreai")`` (optimum's own export, loading and runtime), generates
greedily with optimum's ``generate`` on two inputs, and prints one JSON
object with its ids beside Hugging Face ``generate``'s and the encoder's
output beside Hugging Face's cross-attention keys and values.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import transformers

import coreai_partitioner.recipes.optimum  # noqa: F401 - registers the coreai recipes
from coreai_partitioner.text2text.tiny import tiny_model, tiny_tokenizer

from optimum.executorch import ExecuTorchModelForSeq2SeqLM  # noqa: E402

PROMPTS = ("translate: hello world", "a second input, a longer one")
#: optimum's ``max_seq_len`` (the cache, and its generate's length) and ``max_hidden_seq_len`` (the longest input).
MAX_SEQ_LEN, MAX_INPUT_LEN = 16, 40


def hf_cross(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Hugging Face's cross-attention keys then values of every decoder layer, the layout of ``encoder``'s output."""
    out = model(input_ids=input_ids, decoder_input_ids=torch.tensor([[0]]), use_cache=True)
    cache = out.past_key_values.cross_attention_cache
    return torch.cat([torch.cat([layer.keys, layer.values], dim=1) for layer in cache.layers], dim=1)


def main() -> None:
    model = tiny_model("flan-t5")
    report = {"transformers": transformers.__version__, "inputs": []}
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)
        exported = ExecuTorchModelForSeq2SeqLM.from_pretrained(
            directory, recipe="coreai", task="text2text-generation", max_seq_len=MAX_SEQ_LEN, max_hidden_seq_len=MAX_INPUT_LEN
        )
        report["methods"] = sorted(exported.model.method_names())
        for prompt in PROMPTS:
            input_ids = torch.tensor([tiny_tokenizer().encode(prompt).ids])
            got = exported.generate(input_ids, max_seq_len=MAX_SEQ_LEN)
            encoded = exported.model.run_method("encoder", (input_ids,))[0]
            with torch.no_grad():
                wanted = model.generate(input_ids, max_new_tokens=MAX_SEQ_LEN - 1, max_length=None, do_sample=False)[0].tolist()
                expected = hf_cross(model, input_ids)
            report["inputs"].append({
                "length": input_ids.shape[1], "pte": got, "hf": wanted,
                "encoder_error": float((encoded - expected).abs().max()), "scale": float(expected.abs().max()),
            })
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
