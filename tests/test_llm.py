"""One LLM .pte for ExecuTorch's LLM runner: forward(tokens [1, T], input_pos [T]) over a delegate-owned KV cache."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from executorch.exir import to_edge  # noqa: E402

from coreai_partitioner import get_default_compile_config, hf, verify  # noqa: E402
from coreai_partitioner.passes import NarrowToCoreAIDtypes  # noqa: E402
from coreai_partitioner.pte import read_pte  # noqa: E402

SHAPES = hf.DecoderShapes(max_context_len=32, prefill_chunk=8)


def tiny(kind: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(hf.tiny_config(kind)).to(dtype).eval()


# ---------------------------------------------------------------- fast


def test_prefill_calls_split_a_prompt_by_the_chunk():
    calls = hf.prefill_calls(list(range(20)), 3, SHAPES)
    assert [tokens.shape[1] for tokens, _, _ in calls] == [8, 8, 4]
    assert calls[1][1].tolist() == list(range(11, 19))


def test_a_prompt_longer_than_the_context_is_refused_naming_the_limit():
    with pytest.raises(ValueError, match="context of 32 .max_context_len"):
        hf.prefill_calls(list(range(30)), 5, SHAPES)


def test_a_call_above_the_prefill_chunk_is_refused_naming_the_limit():
    with pytest.raises(ValueError, match="prefill chunk 8"):
        hf.check_call(torch.zeros(1, 9, dtype=torch.long), SHAPES)
    hf.check_call(torch.zeros(1, 8, dtype=torch.long), SHAPES)


def test_shapes_refuse_a_chunk_longer_than_the_context():
    with pytest.raises(ValueError, match="prefill_chunk 64 must be between 1 and max_context_len 32"):
        hf.DecoderShapes(max_context_len=32, prefill_chunk=64)


def test_runner_metadata_has_what_executorchs_llm_runner_reads():
    metadata = hf.runner_metadata(tiny("llama"), SHAPES)
    assert metadata == {
        "get_max_seq_len": 8,
        "get_max_context_len": 32,
        "get_vocab_size": 256,
        "get_bos_id": 1,
        "get_eos_ids": [2],
        "use_kv_cache": True,
        "enable_dynamic_shape": True,
    }


def test_one_hot_cache_write_equals_index_copy():
    cache = torch.randn(1, 2, 10, 4)
    states = torch.randn(1, 2, 3, 4)
    position = torch.tensor([4, 5, 6])
    expected = cache.clone().index_copy_(2, position, states)
    assert torch.equal(hf._write_at(cache, states, position), expected)


def test_static_cache_decoder_prefill_then_decode_equals_hf_eager():
    model = tiny("qwen3")
    tokens = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(tokens).logits
        with hf.coreai_composites(model):
            decoder = hf.StaticCacheDecoder(model, 16)
            prefill = decoder(tokens[:, :5], torch.arange(5))
            step = decoder(tokens[:, 5:], torch.tensor([5]))
    torch.testing.assert_close(prefill, expected[:, :5], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(step, expected[:, 5:], rtol=1e-4, atol=1e-5)


def test_narrowing_runs_on_a_symbolic_expand_and_narrows_inputs_and_aranges():
    class Model(torch.nn.Module):
        def forward(self, tokens):
            return (tokens.expand(2, -1) + torch.arange(3).sum()).float()

    dim = torch.export.Dim("T", min=2, max=8)
    program = torch.export.export(Model(), (torch.zeros(1, 4, dtype=torch.long),), dynamic_shapes=({1: dim},))
    edge = to_edge(program, compile_config=get_default_compile_config()).exported_program()
    # upstream's NarrowToCoreAIDtypesPass: "SymIntArrayRef expected to contain only concrete integers"
    result = NarrowToCoreAIDtypes()(edge.graph_module)
    assert result.modified
    nodes = {n.name: n.meta["val"] for n in result.graph_module.graph.nodes if n.op == "call_function"}
    expand = nodes["aten_expand_copy_default"]
    assert expand.dtype == torch.int32
    assert nodes["aten_arange_start_step"].dtype == torch.int32


# ---------------------------------------------------------------- lowered, run on the Core AI runtime


@pytest.mark.slow
@pytest.mark.parametrize("kind, dtype", [("llama", torch.float32), ("qwen3", torch.float16)])
def test_one_delegate_one_copy_of_the_weights_and_hf_greedy_tokens(kind, dtype, tmp_path):
    model = tiny(kind, dtype)
    lowered = hf.lower_decoder(model, SHAPES)
    path = tmp_path / "model.pte"
    path.write_bytes(lowered.to_executorch().buffer)
    pte = read_pte(path)

    assert [d.method for d in pte.delegates] == ["forward"]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert pte.size < 1.2 * weights  # tiny configs: the asset's fixed overhead is ~60 KB

    prompt = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(prompt).logits
    verify.reset_state(lowered)
    verify.check(lowered, expected, prompt, torch.arange(8)).raise_for_mismatch()

    start = prompt[0, :5].tolist()
    got = hf.greedy_decode(lowered, start, 8, SHAPES)
    with torch.no_grad():
        wanted = model.generate(torch.tensor([start]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0]
    assert got[: len(wanted)] == wanted.tolist()
