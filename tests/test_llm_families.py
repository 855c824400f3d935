"""Every family the LLM path adapts, one row each: its tiny config through the .pte, against Hugging Face eager.

Dense decoders, mixtures of experts (``gather_mm``) and hybrids with
recurrent layers (``gated_delta_update``, short convolutions) alike: the
prompt is one call, and greedy decoding goes on from the state it left.

A row (``ROWS``, in ``llm_helpers.py``: the transformers 5.0.0rc1 test checks
the same counts) names the composites the family's asset must invoke
(counted from the asset).  The tiny configs (each family file's ``tiny_config``) have a
context longer than every sliding window, so a one-call prefill of
``PROMPT`` tokens fills each ring past its window and greedy decoding goes
on over it.  Greedy decoding stops where ``generate`` does, at the model's
own EOS (the ``.pte``'s ``get_eos_ids``), and compares at least
``MIN_TOKENS`` tokens.  Adding a family: its file in
``coreai_partitioner/text_decoder/families/`` and a row in ``ROWS``.
"""

from __future__ import annotations

import tempfile
from collections import Counter

import pytest
import torch

from requires import require

require("transformers", "hf")

from llm_helpers import HOST_IN_CI, ROWS, adapted_and_eager, ci_sample, assert_hf_greedy, prompt_tokens, tiny  # noqa: E402

from coreai_partitioner import text_generation, verify  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.asset_ir import asset_ir, summarize_ir  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte  # noqa: E402

SHAPES = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=24, verify_len=0)  # forward's composites counted in the asset alone; verify's are tests/test_speculative.py's
PROMPT = 20
NEW_TOKENS = 10
MIN_TOKENS = 8


def test_every_family_has_a_row():
    assert sorted(ROWS) == sorted(text_generation.supported())


@pytest.mark.parametrize("model_type", sorted(ROWS))
def test_adapted_decoder_prefill_and_decode_equal_hf_eager(model_type):
    got, expected = adapted_and_eager(model_type, SHAPES, PROMPT)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def asset_composites(path) -> Counter:
    counts: Counter = Counter()
    with tempfile.TemporaryDirectory() as directory:
        for delegate in read_pte(path).coreai_delegates("forward"):
            counts.update(summarize_ir(asset_ir(delegate.asset_path(directory))).composites())
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ci_sample(sorted(ROWS), HOST_IN_CI))
def test_pte_keeps_its_composites_and_matches_hf_eager_until_eos(model_type, tmp_path):
    model = tiny(model_type)
    path = tmp_path / "model.pte"
    path.write_bytes(text_generation.lower_decoder(model, SHAPES).to_executorch().buffer)
    pte = read_pte(path)
    assert [d.method for d in pte.delegates] == ["forward"]
    counts = asset_composites(path)
    assert {name: counts[name] for name in ROWS[model_type]} == ROWS[model_type]

    prompt = prompt_tokens(PROMPT)
    with torch.no_grad():
        expected = model(prompt).logits[:, -1:]
    verify.reset_state(path)
    verify.check(path, expected, prompt, torch.arange(PROMPT)).raise_for_mismatch()  # one call
    verify.check(path, expected, prompt, torch.arange(PROMPT)).raise_for_mismatch()  # at position 0 it starts over

    start = prompt[0].tolist()
    own = model.generation_config.eos_token_id
    assert set(text_generation.eos_ids_of(path)) == ({own} if isinstance(own, int) else set(own))  # the model's EOS, as generate's
    got = text_generation.greedy_decode(path, start, NEW_TOKENS, SHAPES)[PROMPT:]  # stops at the .pte's EOS ids
    assert len(got) >= MIN_TOKENS, got
    assert_hf_greedy(got, model, start, NEW_TOKENS)  # generate with the model's own EOS


@pytest.mark.parametrize("model_type", sorted(ROWS))
def test_the_dry_run_plan_counts_the_composites_the_asset_invokes(model_type):
    # The asset's own count is test_pte_keeps_its_composites_and_matches_hf_eager_until_eos's.
    counts = text_generation.plan(text_generation.tiny_config(model_type), SHAPES).composites
    assert {name: counts.get(name, 0) for name in ROWS[model_type]} == ROWS[model_type]


def wider(model_type: str, **sizes) -> torch.nn.Module:
    """The family's tiny config made wider, so the weights (not the program) are most of the .pte."""
    import transformers

    config = text_generation.tiny_config(model_type)
    for name, value in sizes.items():
        setattr(config, name, value)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_type, sizes",
    [
        ("mixtral", dict(hidden_size=256, intermediate_size=128, vocab_size=512)),  # 2 layers of 8 experts
        ("qwen3_5_text", dict(hidden_size=256, intermediate_size=512, vocab_size=512)),  # delta rule and attention
    ],
    ids=["moe", "hybrid"],
)
def test_every_weight_is_stored_once(model_type, sizes, tmp_path):
    model = wider(model_type, **sizes)
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    assert weights >= 1_000_000
    path = tmp_path / "model.pte"
    path.write_bytes(text_generation.lower_decoder(model, SHAPES).to_executorch().buffer)
    assert read_pte(path).size <= 1.05 * weights, (read_pte(path).size, weights)
