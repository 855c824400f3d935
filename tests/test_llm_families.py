"""Every family the LLM path adapts, one row each: its tiny config through the .pte, against Hugging Face eager.

Dense decoders, mixtures of experts (``gather_mm``) and hybrids with
recurrent layers (``gated_delta_update``, short convolutions) alike: the
prompt is one call, and greedy decoding goes on from the state it left.

A row names the composites the family's asset must invoke (counted from the
asset).  The tiny configs (each family file's ``tiny_config``) have a
context longer than every sliding window, so a one-call prefill of
``PROMPT`` tokens fills each ring past its window and greedy decoding goes
on over it.  Adding a family: its file in ``coreai_partitioner/llm/families/``
and a row here.
"""

from __future__ import annotations

import tempfile
from collections import Counter

import pytest
import torch

pytest.importorskip("transformers")

from llm_helpers import adapted_and_eager, assert_hf_greedy, hf_greedy, prompt_tokens, tiny  # noqa: E402

from coreai_partitioner import llm, verify  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.asset_ir import asset_ir, summarize_ir  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte  # noqa: E402

SHAPES = llm.DecoderShapes(max_context_len=32, prefill_chunk=24)
PROMPT = 20
NEW_TOKENS = 10


def composites(norms: int, ropes: int, attentions: int, experts: int = 0, deltas: int = 0) -> dict[str, int]:
    """What an asset invokes: ``experts`` counts ``gather_mm`` (two per MoE layer), ``deltas`` ``gated_delta_update``."""
    return {
        "rms_norm": norms,
        "rope": ropes,
        "scaled_dot_product_attention": attentions,
        "gather_mm": experts,
        "gated_delta_update": deltas,
    }


#: model_type -> the composites its tiny config's asset invokes.
ROWS = {
    "llama": composites(5, 4, 2),
    "mistral": composites(5, 4, 2),  # every layer slides
    "ministral": composites(5, 4, 2),  # sliding and full layers
    "ministral3": composites(5, 4, 2),  # yarn, Llama 4 query scaling
    "qwen2": composites(5, 4, 2),  # the second layer slides
    "qwen3": composites(9, 4, 2),  # q and k norms
    "smollm3": composites(9, 4, 4),  # two NoPE layers: no RoPE there
    "granite": composites(5, 4, 2),
    "olmo2": composites(17, 8, 4),  # post-norms; q/k norms over the whole projection
    "olmo3": composites(17, 8, 4),  # and sliding layers
    "phi3": composites(5, 4, 2),  # fused projections, partial LongRoPE
    "gemma": composites(5, 4, 2),  # (1 + w) norms
    "gemma2": composites(17, 8, 0),  # soft-capped attention logits: plain ops
    "gemma3_text": composites(25, 8, 4),  # q/k norms, a RoPE table per layer type
    "gemma4_text": composites(46, 10, 6),  # per-layer inputs, KV sharing, k == v, proportional RoPE
    # mixtures of experts
    "qwen3_moe": composites(13, 6, 3, experts=4),  # a dense layer between two sparse ones
    "mixtral": composites(5, 4, 2, experts=4),
    "olmoe": composites(9, 4, 2, experts=4),
    "gpt_oss": composites(5, 4, 2, experts=4),  # attention sinks; sliding and full layers
    # hybrid linear attention
    "qwen3_5_text": composites(15, 4, 2, deltas=2),  # gated delta rule beside gated attention
    "qwen3_next": composites(15, 4, 2, experts=6, deltas=2),  # and experts with a shared one
    "qwen3_5_moe_text": composites(15, 4, 2, experts=8, deltas=2),
    "lfm2": composites(13, 4, 2),  # short convolutions (plain ops) beside attention
}


def test_every_family_has_a_row():
    assert sorted(ROWS) == sorted(llm.supported())


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
@pytest.mark.parametrize("model_type", sorted(ROWS))
def test_pte_keeps_its_composites_and_matches_hf_eager_until_eos(model_type, tmp_path):
    model = tiny(model_type)
    path = tmp_path / "model.pte"
    path.write_bytes(llm.lower_decoder(model, SHAPES).to_executorch().buffer)
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
    free = hf_greedy(model, start, NEW_TOKENS)[0]
    eos = free[min(4, len(free) - 1)]  # a token greedy decoding reaches (or the model's own EOS): it stops there
    got = llm.greedy_decode(path, start, NEW_TOKENS, SHAPES, eos_ids=(eos,))
    assert got[-1] == eos and len(got) <= PROMPT + 5
    assert_hf_greedy(got[PROMPT:], model, start, NEW_TOKENS, eos)


@pytest.mark.parametrize("model_type", sorted(ROWS))
def test_the_dry_run_plan_counts_the_composites_the_asset_invokes(model_type):
    # The asset's own count is test_pte_keeps_its_composites_and_matches_hf_eager_until_eos's.
    counts = llm.plan(llm.tiny_config(model_type), SHAPES).composites
    assert {name: counts.get(name, 0) for name in ROWS[model_type]} == ROWS[model_type]


def wider(model_type: str, **sizes) -> torch.nn.Module:
    """The family's tiny config made wider, so the weights (not the program) are most of the .pte."""
    import transformers

    config = llm.tiny_config(model_type)
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
    path.write_bytes(llm.lower_decoder(model, SHAPES).to_executorch().buffer)
    assert read_pte(path).size <= 1.05 * weights, (read_pte(path).size, weights)
