"""Attention sinks past the context (``lower_decoder(attention_sink=S)``, ``--attention-sink S``): a cache of ``S`` sink
tokens and a ring of ``L - S`` recent ones, judged at every step against an eager StreamingLLM reference over the
Hugging Face model's own modules (``sink_reference.py``: unrotated keys turned to their positions within the cache),
and generating far past ``L`` through ExecuTorch's ``TextLLMRunner``."""

from __future__ import annotations

import pytest
import torch

from requires import require

require("transformers", "hf")

from llm_helpers import prompt_tokens, tiny  # noqa: E402
from sink_reference import sink_logits  # noqa: E402

from coreai_partitioner import save_pte, text_generation, verify  # noqa: E402
from coreai_partitioner.blocks.sinks import POSITIONS, UnsupportedSinks, attention_sinks, held_positions  # noqa: E402
from coreai_partitioner.text_generation.runner import Runner  # noqa: E402

SINKS = 4


def test_the_cache_holds_the_sinks_and_the_last_positions_each_in_its_slot():
    # 4 sinks and a ring of 6: before position 13, slots 4..9 hold 12, 7, 8, 9, 10, 11 (p in 4 + (p - 4) % 6)
    assert held_positions(torch.tensor(13.0), 4, 10).tolist() == [0, 1, 2, 3, 10, 11, 12, 7, 8, 9]
    assert held_positions(torch.tensor(2.0), 4, 10).tolist() == [0, 1] + [-1] * 8
    assert held_positions(torch.tensor(0.0), 4, 10).tolist() == [-1] * 10  # position 0 starts over


def test_the_sink_decoder_equals_streaming_llm_at_every_step_past_its_cache():
    model, context = tiny("llama"), 16
    shapes = text_generation.DecoderShapes(max_context_len=context, prefill_chunk=4)
    decoder = attention_sinks(text_generation.adapt(model, shapes, full_logits=True), SINKS, 4)
    tokens = prompt_tokens(5 * context)
    with torch.no_grad():
        expected = sink_logits(model, tokens[0].tolist(), SINKS, context)
        decoder(prompt_tokens(6, seed=2), torch.arange(6))  # another sequence first: position 0 starts over
        got = [decoder(tokens[:, :4], torch.arange(4))[0]]
        got += [decoder(tokens[:, t : t + 1], torch.tensor([t]))[0] for t in range(4, tokens.shape[1])]
        full = model(tokens).logits[0]
    torch.testing.assert_close(torch.cat(got), expected, rtol=1e-4, atol=1e-5)
    assert (full[context:] - expected[context:]).abs().max() > 1e-2  # past the cache it is not full attention


@pytest.mark.parametrize(
    "model_type, why",
    [
        ("qwen3_5_text", r"qwen3_5_text: layer 0 keeps recurrent state, not a KV cache"),
        ("lfm2", r"lfm2: layer 0 keeps recurrent state, not a KV cache"),
        ("smollm3", r"smollm3: model\.layers\.\d+\.self_attn applies no RoPE \(a NoPE layer\)"),
        ("phi3", r"phi3: model\.layers\.0\.self_attn's LongRoPE picks its frequencies by the sequence's length"),
    ],
)
def test_families_whose_attention_is_not_rope_over_a_kv_cache_are_refused_naming_why(model_type, why):
    shapes = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=4)
    with pytest.raises(UnsupportedSinks, match=why):
        text_generation.lower_decoder(tiny(model_type), shapes, attention_sink=SINKS)


def test_a_call_longer_than_the_ring_and_the_device_form_are_refused_before_export():
    model = tiny("llama")
    with pytest.raises(UnsupportedSinks, match=r"longer than the ring of 12 recent slots; give --prefill-chunk 12 or less"):
        text_generation.lower_decoder(model, text_generation.DecoderShapes(16, 14), attention_sink=SINKS)
    with pytest.raises(UnsupportedSinks, match="built for the host form's dynamic shapes"):
        text_generation.lower_decoder(model, text_generation.DecoderShapes(16, 4, target="device"), attention_sink=SINKS)


@pytest.mark.slow
def test_a_64_token_cache_with_4_sinks_generates_512_tokens_through_text_llm_runner_as_the_reference(tmp_path):
    model, context = tiny("llama"), 64
    shapes = text_generation.DecoderShapes(max_context_len=context, prefill_chunk=4)
    path = save_pte(text_generation.lower_decoder(model, shapes, attention_sink=SINKS), tmp_path / "model.pte")
    assert verify.run(path, method="get_max_context_len")[0] == POSITIONS  # the runner does not stop at 64
    text_generation.byte_tokenizer(model.config).save(str(tmp_path / "tokenizer.json"))

    prompt = "Hello"
    result = Runner(path, tmp_path / "tokenizer.json").generate(prompt, max_new_tokens=512)
    generated = [ord(c) if ord(c) < 0x100 else ord(c) - 0x100 for c in result.text]
    assert len(generated) == 512
    ids = text_generation.byte_tokenizer(model.config).encode(prompt).ids
    tokens = ids + generated

    expected = sink_logits(model, tokens, SINKS, context)
    verify.reset_state(path)
    got = torch.cat([verify.run(path, torch.tensor([[t]]), torch.tensor([p]))[0][0] for p, t in enumerate(tokens[:-1])])
    torch.testing.assert_close(got, expected[:-1], rtol=1e-4, atol=1e-4)  # logits at every step, past 64 too
    picked = expected[len(ids) - 1 : -1].argmax(-1).tolist()
    ties = [i for i, (a, b) in enumerate(zip(picked, generated)) if a != b]
    for i in ties:  # the runner's greedy token differs only where the reference's top two tie
        top = expected[len(ids) - 1 + i].topk(2).values
        assert float(top[0] - top[1]) < 1e-4, (i, picked[i], generated[i])
