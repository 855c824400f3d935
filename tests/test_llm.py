"""One LLM .pte for ExecuTorch's LLM runner: forward(tokens [1, T], input_pos [T]) over delegate-owned caches.

What every family shares: shapes and calls, the runner's metadata, the cache
writes and the sliding-window ring, the refusals, fp16, enumerated shapes and
ExecuTorch's own ``TextLLMRunner``.  Each family's own row is
``test_llm_families.py``.
"""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import torch

from requires import require

transformers = require("transformers", "hf")

from executorch.exir import to_edge  # noqa: E402
from llm_helpers import assert_hf_greedy, prompt_tokens, tiny  # noqa: E402

from coreai_partitioner import get_default_compile_config, text_generation, verify  # noqa: E402
from coreai_partitioner import blocks  # noqa: E402
from coreai_partitioner.partition.op_support import OperatorSupport  # noqa: E402
from coreai_partitioner.lowering.passes import remove_noop_expands  # noqa: E402
from coreai_partitioner.lowering.passes import NarrowToCoreAIDtypes  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.loaded_asset import LoadedAsset  # noqa: E402

SHAPES = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=8)
ENUMERATED = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=8, mode="enumerated")


# ---------------------------------------------------------------- fast


def test_prefill_calls_split_a_prompt_by_the_chunk():
    calls = text_generation.prefill_calls(list(range(20)), 3, SHAPES)
    assert [tokens.shape[1] for tokens, _, _ in calls] == [8, 8, 4]
    assert calls[1][1].tolist() == list(range(11, 19))


def test_enumerated_prefill_calls_pad_a_short_chunk_in_front_past_the_context():
    calls = text_generation.prefill_calls(list(range(11)), 0, ENUMERATED)
    assert [(tokens.shape[1], used) for tokens, _, used in calls] == [(8, 8), (8, 3)]
    tokens, positions, _ = calls[1]
    assert tokens[0, -3:].tolist() == [8, 9, 10]  # the real tokens last: last-position logits are theirs
    assert positions.tolist() == [32, 33, 34, 35, 36, 8, 9, 10]  # padding at the context and past it
    assert ENUMERATED.input_enumerations() == [{1: [1, 8]}, {0: [1, 8]}]
    assert not text_generation.runner_metadata(tiny("llama"), ENUMERATED)["enable_dynamic_shape"]


def test_a_prompt_longer_than_the_context_is_refused_naming_the_limit():
    with pytest.raises(ValueError, match="context of 32 .max_context_len"):
        text_generation.prefill_calls(list(range(30)), 5, SHAPES)


def test_a_call_above_the_prefill_chunk_is_refused_naming_the_limit():
    with pytest.raises(ValueError, match="prefill chunk 8"):
        text_generation.check_call(torch.zeros(1, 9, dtype=torch.long), SHAPES)
    text_generation.check_call(torch.zeros(1, 8, dtype=torch.long), SHAPES)


def test_shapes_refuse_a_chunk_longer_than_the_context():
    with pytest.raises(ValueError, match="prefill_chunk 64 must be between 1 and max_context_len 32"):
        text_generation.DecoderShapes(max_context_len=32, prefill_chunk=64)


def test_greedy_decode_refuses_a_prompt_that_does_not_fit_the_context_before_running():
    with pytest.raises(ValueError, match="33 tokens do not fit in the context of 32"):
        text_generation.greedy_decode(None, list(range(30)), 4, SHAPES)


def test_runner_metadata_has_what_executorchs_llm_runner_reads():
    metadata = text_generation.runner_metadata(tiny("llama"), SHAPES)
    assert metadata == {
        "get_max_seq_len": 8,
        "get_max_context_len": 32,
        "get_vocab_size": 256,
        "get_bos_id": 1,
        "get_eos_ids": [2],
        "use_kv_cache": True,
        "enable_dynamic_shape": True,
    }


def test_an_unknown_architecture_is_refused_before_any_work_naming_the_families_and_the_way_out():
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(text_generation.UnsupportedModel) as error:
        text_generation.lower_decoder(model, SHAPES)
    message = str(error.value)
    assert "model_type 'gpt2'" in message and "llama" in message and "ExternalizeSpec" in message
    assert "\n" not in message


def test_a_context_past_the_models_maximum_is_refused_naming_the_field():
    model = tiny("llama")
    with pytest.raises(text_generation.UnsupportedConfig, match=r"llama: config.max_position_embeddings = 256 .* max_context_len 512"):
        text_generation.adapt(model, text_generation.DecoderShapes(max_context_len=512, prefill_chunk=8))


def test_a_rope_type_no_table_can_hold_is_refused_naming_the_field():
    model = tiny("llama")
    model.model.rotary_emb.rope_type = "made_up"  # a RoPE type from a transformers release newer than this adapter
    with pytest.raises(text_generation.UnsupportedConfig, match=r"llama: config.rope_parameters\['rope_type'\] = 'made_up' .* one of default"):
        text_generation.adapt(model, SHAPES)


def test_one_hot_cache_write_equals_index_copy():
    cache = torch.randn(1, 2, 10, 4)
    states = torch.randn(1, 2, 3, 4)
    position = torch.tensor([4, 5, 6])
    expected = cache.clone().index_copy_(2, position, states)
    assert torch.equal(blocks.write_at(cache, states, blocks.write_plan(position, cache.shape, cache.dtype)), expected)


@pytest.mark.parametrize("calls", [[11], [3, 1, 1, 5, 1], [1] * 11, [6, 5]], ids=str)
def test_the_sliding_ring_attends_the_last_window_positions_whatever_the_calls(calls):
    window, context = 4, 32
    slot_positions = torch.zeros(window)  # empty
    ring = torch.zeros(1, 1, window, 1)  # each slot holds its token's position plus one
    start = 0
    for length in calls:
        position = torch.arange(start, start + length, dtype=torch.float32)
        plan = blocks.window_plan(slot_positions, position, window, context)
        keys = torch.cat([ring[0, 0, :, 0] - 1, position])
        for row, q in enumerate(position.tolist()):
            attended = sorted(keys[plan.mask[0, 0, row]].tolist())
            assert attended == [p for p in range(int(q) + 1) if q - window < p], (q, attended)
        ring = blocks.ring_write(ring, position.view(1, 1, -1, 1) + 1, plan)
        slot_positions = plan.positions
        assert sorted(slot_positions.tolist()) == sorted(ring[0, 0, :, 0].tolist())
        start += length


def test_a_new_sequence_at_position_0_never_attends_a_ring_slot_left_from_the_last():
    window, context = 4, 32
    old = blocks.window_plan(torch.zeros(window), torch.arange(11.0), window, context).positions  # 7..10 left
    plan = blocks.window_plan(old, torch.arange(10.0), window, context)  # reaches the old slots' positions
    keys = torch.cat([old - 1, torch.arange(10.0)])
    for q in range(10):
        assert sorted(keys[plan.mask[0, 0, q]].tolist()) == [p for p in range(q + 1) if q - window < p]


def test_the_sliding_ring_skips_front_padding_past_the_context():
    window, context = 4, 16
    plan = blocks.window_plan(torch.zeros(window), torch.tensor([16.0, 17.0, 0.0, 1.0]), window, context)
    assert sorted(p - 1 for p in plan.positions.tolist() if p > 0) == [0.0, 1.0]
    assert plan.mask[0, 0, 3].tolist() == [False] * window + [False, False, True, True]


def test_state_writes_are_put_in_the_order_of_their_buffers():
    from coreai_partitioner.backends.apple_coreai.passes import order_state_writes

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("first", torch.zeros(2))
            self.register_buffer("second", torch.zeros(2))

        def forward(self, x):
            self.first.copy_(x * 2)
            self.second.copy_(x)
            return x + 1

    program = torch.export.export(Model(), (torch.ones(2),)).run_decompositions({})  # functional: mutations are outputs
    # A delegate's program can come out of partitioning with its state writes in another order than its buffers.
    output = program.graph.output_node()
    first, second, result = output.args[0]
    output.args = ((second, first, result),)
    specs = program.graph_signature.output_specs
    specs[0], specs[1] = specs[1], specs[0]
    mutated = lambda: [s.target for s in program.graph_signature.output_specs if s.kind.name == "BUFFER_MUTATION"]  # noqa: E731
    assert mutated() == ["second", "first"]

    assert order_state_writes(program) and mutated() == ["first", "second"]
    assert not order_state_writes(program)
    module = program.module()
    assert torch.equal(module(torch.ones(2)), torch.full((2,), 2.0))
    assert module.first.tolist() == [2.0, 2.0] and module.second.tolist() == [1.0, 1.0]


def test_adapted_decoder_prefill_then_decode_equals_hf_eager():
    model = tiny("qwen3")
    tokens = prompt_tokens(6)
    with torch.no_grad():
        expected = model(tokens).logits
        decoder = text_generation.adapt(model, text_generation.DecoderShapes(16, 8), full_logits=True)
        prefill = decoder(tokens[:, :5], torch.arange(5))
        step = decoder(tokens[:, 5:], torch.tensor([5]))
    torch.testing.assert_close(prefill, expected[:, :5], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(step, expected[:, 5:], rtol=1e-4, atol=1e-5)


def test_an_adapted_decoder_moves_to_another_dtype_as_any_module_does():
    decoder = text_generation.adapt(tiny("llama"), SHAPES).to(torch.float16)  # nn.Module.to goes through every block's _apply
    assert {p.dtype for p in decoder.parameters()} == {torch.float16}


def test_forward_returns_the_last_positions_logits_by_default():
    model = tiny("llama")
    tokens = prompt_tokens(6)
    with torch.no_grad():
        expected = model(tokens).logits
        last = text_generation.adapt(model, SHAPES)(tokens, torch.arange(6))
    assert last.shape == (1, 1, 256)
    torch.testing.assert_close(last, expected[:, -1:], rtol=1e-4, atol=1e-5)


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


def symbolic_graph() -> torch.fx.GraphModule:
    """An edge graph over a symbolic ``T``: a float view, an int64 view, an index_put along ``T``."""

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", torch.zeros(1, 16, 4))

        def forward(self, x, positions, tokens):
            heads = x.view(1, x.shape[1], 2, 2)
            flat = tokens.view(tokens.shape[1])
            written = torch.ops.aten.index_put.default(self.cache, [None, positions], x)
            return heads, flat, written

    dim = torch.export.Dim("T", min=1, max=8)
    sample = (torch.randn(1, 4, 4), torch.arange(4, dtype=torch.int32), torch.zeros(1, 4, dtype=torch.long))
    program = torch.export.export(Graph(), sample, dynamic_shapes=({1: dim}, {0: dim}, {1: dim}))
    return to_edge(program, compile_config=get_default_compile_config()).exported_program().graph_module


def test_op_support_claims_symbolic_views_and_refuses_64_bit_ops_and_index_put_along_a_symbolic_dim():
    from coreai_partitioner.lowering.passes import SplitSymbolicSizes

    graph_module = symbolic_graph()
    SplitSymbolicSizes()(graph_module)  # one sym_size per reader, as get_default_passes() does
    support = OperatorSupport(claimable=set(), unpaired={})
    submodules = dict(graph_module.named_modules())
    claimed = {
        n.name: support.is_node_supported(submodules, n) for n in graph_module.graph.nodes if n.op == "call_function"
    }
    readers = {n.name: next(iter(n.users)).name for n in graph_module.graph.nodes if n.name.startswith("sym_size")}
    assert claimed.pop(next(s for s, r in readers.items() if r == "aten_view_copy_default"))  # made inside, read inside
    assert not claimed.pop(next(s for s, r in readers.items() if r == "aten_view_copy_default_1"))  # its reader stays out
    assert claimed == {
        "aten_view_copy_default": True,  # float [1, T, 4] -> [1, T, 2, 2]
        "aten_view_copy_default_1": False,  # int64: a Core AI delegate cannot carry it
        "aten_index_put_default": False,  # coreai-torch: index_put only along a symbolic dim 0
    }


def test_noop_expands_go_and_real_ones_stay():
    class Model(torch.nn.Module):
        def forward(self, x):
            same = x.expand(1, x.shape[1], 4)
            return same * 2, x.expand(3, -1, -1)

    dim = torch.export.Dim("T", min=1, max=8)
    program = torch.export.export(Model(), (torch.randn(1, 5, 4),), dynamic_shapes=({1: dim},))
    assert remove_noop_expands(program.graph_module) == 1
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.aten.expand.default) == 1
    x = torch.randn(1, 1, 4)  # T = 1, the value the removed expand broke in Core AI
    doubled, repeated = program.module()(x)
    assert torch.equal(doubled, x * 2) and repeated.shape == (3, 1, 4)


# ---------------------------------------------------------------- lowered, run on the Core AI runtime
#
# Each (kind, dtype, mode, full logits) is lowered once per session; tests share the .pte.  Every family
# in fp32 and the dynamic mode is test_llm_families.py's; here fp16 (one per mode), enumerated shapes,
# all-position logits and ExecuTorch's TextLLMRunner.


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``exported(kind, dtype, shapes, full_logits) -> (model, .pte path)``, tokenizer.json beside the .pte."""
    done = {}

    def export(kind, dtype, shapes, full_logits=False):
        key = (kind, dtype, shapes.mode, full_logits)
        if key not in done:
            model = tiny(kind, dtype)
            directory = tmp_path_factory.mktemp(f"{kind}-{str(dtype)[6:]}-{shapes.mode}")
            path = directory / "model.pte"
            path.write_bytes(text_generation.lower_decoder(model, shapes, full_logits=full_logits).to_executorch().buffer)
            text_generation.byte_tokenizer(model.config).save(str(directory / "tokenizer.json"))
            done[key] = model, path
        return done[key]

    return export


@pytest.mark.slow
def test_full_logits_pte_returns_every_positions_logits_equal_to_hf_eager(exported):
    model, path = exported("mistral", torch.float32, SHAPES, full_logits=True)
    prompt = prompt_tokens()
    with torch.no_grad():
        expected = model(prompt).logits
    verify.reset_state(path)
    verify.check(path, expected, prompt, torch.arange(8)).raise_for_mismatch()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen3", "gemma3_text"])
def test_fp16_pte_prefills_in_one_call_and_generates_hf_greedy_tokens(kind, exported):
    model, path = exported(kind, torch.float16, SHAPES)
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    assert read_pte(path).size < weights + 40_000
    prompt = prompt_tokens()
    with torch.no_grad():
        expected = model(prompt).logits[:, -1:]
    verify.reset_state(path)
    report = verify.check(path, expected, prompt, torch.arange(8))
    assert report.outputs[0].rtol == 1e-2
    report.raise_for_mismatch()
    start = prompt[0, :5].tolist()
    assert_hf_greedy(text_generation.greedy_decode(path, start, 8, SHAPES)[5:], model, start, 8)


@pytest.mark.slow
def test_a_call_above_the_prefill_chunk_is_refused_by_executorchs_runtime(exported):
    _, path = exported("llama", torch.float32, SHAPES)
    verify.reset_state(path)
    # ExecuTorch will not resize an input past its exported upper bound: InvalidArgument (0x10), no output.
    # Its message does not name the limit; text_generation.check_call does (test_a_call_above_the_prefill_chunk_is_refused_naming_the_limit).
    with pytest.raises(RuntimeError, match=r"set_inputs\(\) for method 'forward' failed with error 0x10"):
        verify.run(path, torch.zeros(1, 9, dtype=torch.long), torch.arange(9))


def runner_tokens(path, prompt: str, new_tokens: int, times: int = 1) -> list[int]:
    """ExecuTorch's own TextLLMRunner on the .pte (host backend), its greedy output as token ids.

    ``times`` > 1 generates again after the runner's ``reset()``, on the same loaded program, and
    returns the last run's tokens.
    """
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    from coreai_partitioner import load_runtime_backend

    load_runtime_backend()
    runner = TextLLMRunner(str(path), str(path.parent / "tokenizer.json"))
    config = GenerationConfig(max_new_tokens=new_tokens, temperature=0.0, echo=False)
    for _ in range(times):
        pieces: list[str] = []
        runner.reset()
        runner.generate(prompt, config, token_callback=pieces.append)
    return [ord(c) if ord(c) < 0x100 else ord(c) - 0x100 for c in "".join(pieces)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, dtype, shapes",
    [("gemma3_text", torch.float32, SHAPES), ("qwen3", torch.float16, SHAPES), ("gemma3_text", torch.float32, ENUMERATED)],
    ids=["gemma3-dynamic", "qwen3-fp16-dynamic", "gemma3-enumerated"],
)
def test_text_llm_runner_generates_hf_greedy_tokens_from_the_pte(kind, dtype, shapes, exported):
    model, path = exported(kind, dtype, shapes)
    prompt = "Hello, Core AI"  # 14 tokens: past the sliding window of 8
    ids = text_generation.byte_tokenizer(model.config).encode(prompt).ids
    got = runner_tokens(path, prompt, 10, times=2 if shapes is SHAPES else 1)  # after reset(), from position 0
    assert_hf_greedy(got, model, ids, len(got))


def enumerated_greedy(path, prompt: list[int], new_tokens: int, shapes: text_generation.DecoderShapes) -> tuple[list[int], torch.Tensor]:
    """Greedy decoding from an enumerated .pte's asset: its T = chunk and T = 1 functions, one shared state.

    Returns the tokens and the logits of the first (front-padded) prefill call.
    """
    from coreai.authoring import AIModelAsset

    (delegate,) = read_pte(path).coreai_delegates("forward")
    with tempfile.TemporaryDirectory() as directory:
        asset_path = delegate.asset_path(directory)
        names = AIModelAsset.load(asset_path).summary().function_names
        asset = LoadedAsset(asset_path)  # dispatches on the input shapes
    assert sorted(names) == [f"main_{symbol}_{t}" for symbol in {n.split("_")[1] for n in names} for t in (1, shapes.prefill_chunk)]
    state = asset.new_state()

    def forward(tokens: torch.Tensor, positions: torch.Tensor) -> np.ndarray:
        inputs = dict(zip(asset.input_names, (tokens.numpy().astype(np.int32), positions.numpy().astype(np.int32))))
        return asset(inputs, state)[asset.output_names[-1]]

    tokens, first = list(prompt), None
    for chunk, positions, _ in text_generation.prefill_calls(prompt, 0, shapes):
        logits = forward(chunk, positions)
        first = logits if first is None else first
    for _ in range(new_tokens):
        tokens.append(int(logits[0, -1].argmax()))
        logits = forward(torch.tensor([[tokens[-1]]]), torch.tensor([len(tokens) - 1]))
    asset.close()
    return tokens, torch.from_numpy(first)


@pytest.mark.slow
@pytest.mark.parametrize("kind, dtype", [("mistral", torch.float32), ("qwen2", torch.float16)])
def test_enumerated_pte_has_one_asset_with_t_1_and_t_chunk_sharing_the_weights_and_hf_greedy_tokens(kind, dtype, exported):
    model, path = exported(kind, dtype, ENUMERATED)
    pte = read_pte(path)
    assert [d.method for d in pte.delegates] == ["forward"]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert pte.size < weights + 64_000, (pte.size, weights)  # one copy of the weights under two entrypoints

    prompt = prompt_tokens()
    with torch.no_grad():
        expected = model(prompt).logits[:, -1:]
    _, first = enumerated_greedy(path, prompt[0].tolist(), 1, ENUMERATED)  # one T = 8 call
    rtol, atol = verify.default_tolerances(dtype)
    torch.testing.assert_close(first.to(dtype), expected, rtol=rtol, atol=atol)

    start = prompt[0, :5].tolist()  # padded in front to the chunk, then T = 1 steps
    got, _ = enumerated_greedy(path, start, 8, ENUMERATED)
    assert_hf_greedy(got[5:], model, start, 8)


@pytest.mark.slow
def test_enumerated_pte_runs_in_executorchs_runtime(exported):
    model, path = exported("mistral", torch.float32, ENUMERATED)
    start = prompt_tokens(11)[0].tolist()  # one full chunk, then three real tokens padded in front
    assert_hf_greedy(text_generation.greedy_decode(path, start, 8, ENUMERATED)[11:], model, start, 8)


def test_hf_greedy_tokens_may_differ_only_at_a_tie_to_hfs_second_and_then_follow_hfs_continuation():
    model = tiny("llama")
    prompt = prompt_tokens(6)[0].tolist()
    with torch.no_grad():
        wanted = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0)[0, 6:].tolist()
        first, other = wanted[0], (wanted[0] + 1) % model.config.vocab_size
        model.lm_head.weight[other] = model.lm_head.weight[first]  # two tokens tie exactly at every position
        taken = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0)[0, 6:].tolist()
    hf_pick, tied = min(first, other), max(first, other)  # argmax takes the first of equals
    assert taken[0] == hf_pick
    assert_hf_greedy(taken, model, prompt, 6)
    with torch.no_grad():  # the other side of the tie, then HF's own continuation of it: honest
        rest = model.generate(torch.tensor([prompt + [tied]]), max_new_tokens=5, do_sample=False, pad_token_id=0)[0, 7:].tolist()
    assert_hf_greedy([tied, *rest], model, prompt, 6)
    with pytest.raises(AssertionError, match="HF's top two"):  # the other side of the tie, then anything
        assert_hf_greedy([tied, *[(t + 1) % model.config.vocab_size for t in rest]], model, prompt, 6)
    with pytest.raises(AssertionError, match="a tie is below"):  # no tie at all
        assert_hf_greedy([(first + 2) % model.config.vocab_size, *rest], model, prompt, 6)
