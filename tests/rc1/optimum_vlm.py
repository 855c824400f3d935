"""optimum-executorch's ``ExecuTorchModelForMultiModalToText`` with the ``coreai`` recipe, on transformers 5.0.0rc1.

Run by ``tests/test_vision.py`` with that transformers first on ``sys.path``.
Saves a tiny random Gemma 3 (SigLIP tower, bidirectional image tokens),
exports it through ``ExecuTorchModelForMultiModalToText.from_pretrained(dir,
recipe="coreai")`` (optimum's own export, loading and runtime), generates
greedily with optimum's ``generate`` from a prompt with an image in the
middle, and prints one JSON object with those tokens and Hugging Face
``generate``'s over the same input ids, pixel values and token type ids.
"""

from __future__ import annotations

import json
import tempfile

import torch
import transformers

import coreai_partitioner.recipes.optimum  # noqa: F401 - registers the coreai recipes
from coreai_partitioner import image_text_to_text

from optimum.executorch import ExecuTorchModelForMultiModalToText  # noqa: E402

NEW_TOKENS = 8


def main() -> None:
    config = image_text_to_text.tiny_config("gemma3")
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() > 1 and bool((parameter == parameter.flatten()[0]).all()):
                parameter.add_(torch.empty_like(parameter).uniform_(-0.5, 0.5))
    image = [config.boi_token_id] + [config.image_token_id] * config.mm_tokens_per_image + [config.eoi_token_id]
    ids = torch.tensor([[5, 6, 7] + image + [8, 9]])
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)
        exported = ExecuTorchModelForMultiModalToText.from_pretrained(
            directory, recipe="coreai", task="multimodal-text-to-text", max_length=64
        )
        methods = sorted(exported.model.method_names())

        class Tokenizer:  # what optimum's generate prints the tokens with
            def decode(self, tokens):
                return ""

        exported.tokenizer = Tokenizer()
        # echo=True: with echo=False optimum 1.1.0 drops len(prompt_tokens) = 1 (a [1, L] tensor's length) generated tokens
        got = exported.generate(ids, echo=True, multimodal_features=pixels, max_seq_len=ids.shape[1] + NEW_TOKENS)
        logits = exported.forward(ids, torch.arange(ids.shape[1]), multimodal_features=pixels)[0, -1]
    with torch.no_grad():
        types = (ids == config.image_token_id).long()
        both_ways = model(input_ids=ids, pixel_values=pixels, token_type_ids=types).logits[0, -1]
        causal = model(input_ids=ids, pixel_values=pixels).logits[0, -1]
        wanted = model.generate(
            input_ids=ids, pixel_values=pixels, token_type_ids=types,
            attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
        )
    print(json.dumps({
        "transformers": transformers.__version__, "methods": methods, "optimum": got, "hf": wanted[0, ids.shape[1]:].tolist(),
        "prefill_error": float((logits - both_ways).abs().max()), "causal_gap": float((causal - both_ways).abs().max()),
    }))


if __name__ == "__main__":
    main()
