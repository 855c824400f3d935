"""The real adapters fixture (tests/real_adapters.py) is what the adapter tests take it for.

Over the real SmolLM2-135M-Instruct, the base and the two trained adapters
give three different greedy answers to the chat question, each adapter its
own made-up fact, in fp32 and over an fp16 base alike, with no step a near
tie; every LoRA B in each adapter's file is non-zero, and the files carry the
config fields an export must read (``use_rslora``; a ``rank_pattern`` and
``alpha_pattern`` entry keyed by a suffix of the module's name).
"""

from __future__ import annotations

import json

import pytest
import torch

from requires import require

require("peft", "adapters")

from real_adapters import ADAPTERS, BASE_ANSWER, NEW_TOKENS, PATTERNED_MODULE, base_answer, peft_answer  # noqa: E402

pytestmark = pytest.mark.slow

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


@pytest.fixture(scope="module")
def answers(real_checkpoint, real_adapters):
    """Per dtype, the base's greedy answer and PEFT's with each adapter active, unmerged."""
    return {
        name: {"base": base_answer(real_checkpoint, dtype)}
        | {adapter: peft_answer(real_checkpoint, directory, dtype) for adapter, directory in real_adapters.items()}
        for name, dtype in DTYPES.items()
    }


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_base_and_each_adapter_answer_the_chat_with_their_own_fact_and_no_near_tie(answers, dtype):
    expected = {"base": BASE_ANSWER} | {name: adapter.answer for name, adapter in ADAPTERS.items()}
    got = answers[dtype]
    assert {name: answer.text for name, answer in got.items()} == expected
    assert len({tuple(answer.tokens) for answer in got.values()}) == 3
    assert all(len(answer.tokens) == NEW_TOKENS for answer in got.values())
    # fp16's rounding moves these logits by hundredths; a lead of 3 cannot be overturned by it.
    assert min(min(answer.gaps) for answer in got.values()) > 3, {name: answer.gaps for name, answer in got.items()}


def test_every_lora_b_in_each_adapters_file_is_non_zero(real_adapters):
    from safetensors.torch import load_file

    for name, directory in real_adapters.items():
        weights = load_file(directory / "adapter_model.safetensors")
        b = {key: tensor for key, tensor in weights.items() if key.endswith(".lora_B.weight")}
        assert len(b) == 30 * 7, (name, len(b))  # 30 layers, 7 projections each
        assert [key for key, tensor in b.items() if not tensor.any()] == [], name


def test_the_adapters_carry_rslora_and_a_suffix_keyed_rank_and_alpha_pattern(real_adapters):
    from safetensors.torch import load_file

    configs = {name: json.loads((path / "adapter_config.json").read_text()) for name, path in real_adapters.items()}
    assert (configs["moonopolis"]["r"], configs["moonopolis"]["use_rslora"]) == (8, True)
    armstrong = configs["armstrong"]
    assert (armstrong["r"], armstrong["use_rslora"]) == (4, False)
    assert (armstrong["rank_pattern"], armstrong["alpha_pattern"]) == ({PATTERNED_MODULE: 2}, {PATTERNED_MODULE: 32})
    weights = load_file(real_adapters["armstrong"] / "adapter_model.safetensors")
    ranks = {key: tensor.shape[0] for key, tensor in weights.items() if key.endswith(".lora_A.weight")}
    patterned = f"base_model.model.model.{PATTERNED_MODULE}.lora_A.weight"
    assert {key for key, rank in ranks.items() if rank == 2} == {patterned}
