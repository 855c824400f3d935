"""optimum-executorch with the ``coreai`` recipe, on transformers 5.0.0rc1 (what it pins).

Run by ``tests/test_transformers_rc1.py`` with that transformers first on
``sys.path``.  Saves a tiny Llama checkpoint, exports it through
``ExecuTorchModelForCausalLM.from_pretrained(dir, recipe=...)`` (optimum's
own export, loading and runtime), generates greedily with optimum's
``generate``, and prints one JSON object with those tokens and Hugging
Face ``generate``'s.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llm_helpers import tiny  # noqa: E402

import coreai_partitioner.recipes.optimum  # noqa: E402,F401 - registers the coreai recipes

from optimum.executorch import ExecuTorchModelForCausalLM  # noqa: E402

PROMPT = list(range(3, 15))
NEW_TOKENS = 10


def tokenizer_for(model) -> transformers.PreTrainedTokenizerFast:
    """The tiny configs' one-character-per-token tokenizer, as the transformers tokenizer optimum decodes with."""
    from coreai_partitioner import text_generation

    characters = [chr(i) if 32 <= i < 127 else chr(0x100 + i) for i in range(256)]
    config = model.config
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=text_generation.byte_tokenizer(config),
        bos_token=characters[config.bos_token_id],
        eos_token=characters[config.eos_token_id],
    )


def main(recipe: str) -> None:
    model = tiny("llama")
    tokenizer = tokenizer_for(model)
    prompt = "Hello, Core AI"
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)
        exported = ExecuTorchModelForCausalLM.from_pretrained(
            directory, recipe=recipe, task="text-generation", max_seq_len=32
        )
        methods = sorted(exported.model.method_names())
        got = exported.generate(PROMPT, max_seq_len=len(PROMPT) + NEW_TOKENS)
        text = exported.text_generation(tokenizer, prompt, echo=False, max_seq_len=len(prompt) + NEW_TOKENS)
    with torch.no_grad():
        wanted = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        ids = tokenizer.encode(prompt)
        continued = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    print(json.dumps({
        "transformers": transformers.__version__, "methods": methods,
        "optimum": got, "hf": wanted[0, len(PROMPT):].tolist(),
        "optimum_text": text, "hf_text": tokenizer.decode(continued[0, len(ids):], skip_special_tokens=True),
    }))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "coreai")
