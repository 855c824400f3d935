"""Speculative decoding on the real trained SmolLM2-135M-Instruct: every drafter gives greedy's tokens exactly.

Ten prompts under the model's chat template, 64 new tokens each: five whose
replies quote their prompt (edits, rewrites, extraction), five open
questions.  Every row runs under ``pytest -m benchmark`` (a form takes over
ten minutes here): prompt lookup and lookahead in both forms, and the draft
model (the same checkpoint cut to its first 4 layers: a draft of the same
vocabulary).
``benchmarks/speculative.py`` measures the calls and the time.
"""

from __future__ import annotations

import pytest
import torch

from requires import require  # noqa: E402

require("transformers", "hf")

from llm_helpers import ci_sample  # noqa: E402

from coreai_partitioner import save_pte, text_generation  # noqa: E402
from coreai_partitioner.text_generation.speculative import (  # noqa: E402
    DraftModel,
    Lookahead,
    PromptLookup,
    Target,
    speculative_decode,
)

pytestmark = pytest.mark.slow

QUOTING = [
    "Fix the typo in this sentence and repeat it: 'The quick brown fox jumpd over the lazy dog.'",
    'Rewrite this JSON with the key "name" renamed to "title": {"name": "Dune", "year": 1965, "author": "Frank Herbert"}',
    "Rename the variable x to count in this code: def total(items):\n    x = 0\n    for i in items:\n        x += i\n    return x",
    "Extract the email address from this text: Please contact Maria Lopez at maria.lopez@example.com before Friday.",
    "Make this list alphabetical: banana, apple, cherry, date",
]
OPEN = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Why is the sky blue?",
    "Write a haiku about autumn.",
    "How do plants make their food?",
]
NEW_TOKENS = 64
SHAPES = dict(max_context_len=256, prefill_chunk=32, verify_len=9)


@pytest.fixture(scope="module")
def prompts(real_checkpoint):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(real_checkpoint)
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in QUOTING + OPEN
    ]
    return [tokenizer(text, add_special_tokens=False).input_ids for text in texts]


def export(checkpoint, path, *, target: str = "host", layers: int | None = None) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(checkpoint)
    if layers is not None:
        config = text_generation.first_layers(config, layers)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, config=config, dtype=torch.float32).eval()
    shapes = text_generation.DecoderShapes(**SHAPES, target=target)
    return str(save_pte(text_generation.lower_decoder(model, shapes), path))


@pytest.mark.parametrize("target", ci_sample(["host", "device"], []))  # over 10 minutes a form here: the benchmark tier
def test_every_drafter_gives_greedys_tokens_on_the_real_model(target, real_checkpoint, prompts, tmp_path):
    runtime = Target(export(real_checkpoint, tmp_path / f"smollm2_{target}.pte", target=target))
    eos = text_generation.eos_ids_of(runtime.pte)
    drafters = {"prompt-lookup": PromptLookup(eos_ids=eos), "lookahead": Lookahead()}
    calls = {name: [0, 0] for name in drafters}
    for prompt in prompts:
        greedy = speculative_decode(runtime, prompt, NEW_TOKENS, None, eos_ids=eos)
        for name, drafter in drafters.items():
            speculated = speculative_decode(runtime, prompt, NEW_TOKENS, drafter, eos_ids=eos)
            assert speculated.tokens == greedy.tokens, (name, prompt)
            calls[name][0] += speculated.target_calls
            calls[name][1] += len(speculated.tokens)
    for name, (made, tokens) in calls.items():
        assert made <= tokens, name  # never more calls than tokens


@pytest.mark.benchmark
def test_a_draft_model_gives_greedys_tokens_on_the_real_model(real_checkpoint, prompts, tmp_path):
    runtime = Target(export(real_checkpoint, tmp_path / "smollm2.pte"))
    draft = export(real_checkpoint, tmp_path / "smollm2_4_layers.pte", layers=4)
    eos = text_generation.eos_ids_of(runtime.pte)
    for prompt in prompts:
        greedy = speculative_decode(runtime, prompt, NEW_TOKENS, None, eos_ids=eos)
        speculated = speculative_decode(runtime, prompt, NEW_TOKENS, DraftModel(draft), eos_ids=eos)
        assert speculated.tokens == greedy.tokens, prompt
