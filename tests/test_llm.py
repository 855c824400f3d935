"""One LLM .pte for ExecuTorch's LLM runner: forward(tokens [1, T], input_pos [T]) over a delegate-owned KV cache."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from executorch.exir import to_edge  # noqa: E402

from coreai_partitioner import get_default_compile_config, hf, verify  # noqa: E402
from coreai_partitioner.op_support import OperatorSupport  # noqa: E402
from coreai_partitioner.passes import NarrowToCoreAIDtypes, remove_noop_expands  # noqa: E402
from coreai_partitioner.pte import read_pte  # noqa: E402
from coreai_partitioner.runtime import LoadedAsset  # noqa: E402

SHAPES = hf.DecoderShapes(max_context_len=32, prefill_chunk=8)
ENUMERATED = hf.DecoderShapes(max_context_len=32, prefill_chunk=8, mode="enumerated")


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
    graph_module = symbolic_graph()
    support = OperatorSupport(claimable=set(), unpaired={})
    submodules = dict(graph_module.named_modules())
    claimed = {
        n.name: support.is_node_supported(submodules, n) for n in graph_module.graph.nodes if n.op == "call_function"
    }
    assert claimed == {
        "sym_size": True,  # the SymInt is made inside the delegate, never crosses its boundary
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


def test_an_unsupported_architecture_is_refused_by_lower_decoder_naming_the_supported_ones():
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match="llama, qwen2, qwen3, mistral models; this is GPT2LMHeadModel"):
        hf.lower_decoder(model, SHAPES)


def test_greedy_decode_refuses_a_prompt_that_does_not_fit_the_context_before_running():
    with pytest.raises(ValueError, match="33 tokens do not fit in the context of 32"):
        hf.greedy_decode(None, list(range(30)), 4, SHAPES)


def test_enumerated_prefill_calls_pad_a_short_chunk():
    calls = hf.prefill_calls(list(range(11)), 0, ENUMERATED)
    assert [(tokens.shape[1], used) for tokens, _, used in calls] == [(8, 8), (8, 3)]
    assert ENUMERATED.input_enumerations() == [{1: [1, 8]}, {0: [1, 8]}]
    assert not hf.runner_metadata(tiny("llama"), ENUMERATED)["enable_dynamic_shape"]


# ---------------------------------------------------------------- lowered, run on the Core AI runtime
#
# Each (kind, dtype, mode) is lowered once per session; tests share the .pte.
# fp32 covers all four architectures in the dynamic mode; fp16 two of them (one per mode);
# TextLLMRunner runs twice.  Seven lowerings in all.

DYNAMIC_CASES = [
    ("llama", torch.float32),
    ("qwen2", torch.float32),
    ("qwen3", torch.float32),
    ("mistral", torch.float32),
    ("qwen3", torch.float16),
]
ENUMERATED_CASES = [("llama", torch.float32), ("qwen2", torch.float16)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``exported(kind, dtype, shapes) -> (model, .pte path)``, the .pte written with tokenizer.json beside it."""
    done = {}

    def export(kind, dtype, shapes):
        key = (kind, dtype, shapes.mode)
        if key not in done:
            model = tiny(kind, dtype)
            directory = tmp_path_factory.mktemp(f"{kind}-{str(dtype)[6:]}-{shapes.mode}")
            path = directory / "model.pte"
            path.write_bytes(hf.lower_decoder(model, shapes).to_executorch().buffer)
            hf.byte_tokenizer(model.config).save(str(directory / "tokenizer.json"))
            done[key] = model, path
        return done[key]

    return export


def prompt_tokens(length: int = 8) -> torch.Tensor:
    return torch.randint(3, 256, (1, length), generator=torch.Generator().manual_seed(1))


def hf_greedy(model, prompt: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
    """Hugging Face ``generate``'s greedy new tokens, and at each step the margin between its top two logits."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
            output_scores=True, return_dict_in_generate=True,
        )
    top2 = [scores[0].float().topk(2).values for scores in out.scores]
    return out.sequences[0, len(prompt) :].tolist(), [float(a - b) for a, b in top2]


#: Logit margins below which two tokens tie: fp16 resolves about 1e-3 at the logits' scale.
TIES = {torch.float32: 1e-5, torch.float16: 2e-3}


def assert_hf_greedy(got: list[int], model, prompt: list[int], new_tokens: int) -> None:
    """``got`` (new tokens) is HF's greedy continuation of ``prompt``.

    A token may differ only where HF's top two logits tie (fp16 ties are real
    in a random tiny model: either side may pick either token); the sequences
    owe each other nothing after that.  ``got`` may end where HF generates EOS
    (ExecuTorch's runner prints nothing for it).
    """
    wanted, margins = hf_greedy(model, prompt, new_tokens)
    for step, (expected, margin) in enumerate(zip(wanted, margins)):
        if step == len(got):
            assert expected == model.config.eos_token_id, f"stopped after {got}; HF goes on: {wanted}"
            return
        if got[step] != expected:
            assert margin < TIES[model.dtype], f"step {step}: {got} != HF {wanted} (HF's top-two margin {margin:.3g})"
            return


@pytest.mark.slow
@pytest.mark.parametrize("kind, dtype", DYNAMIC_CASES)
def test_dynamic_pte_prefills_in_one_call_and_generates_hf_greedy_tokens(kind, dtype, exported):
    model, path = exported(kind, dtype, SHAPES)
    pte = read_pte(path)
    assert [d.method for d in pte.delegates] == ["forward"]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # One copy of the weights and a ~16 kB program (1.04x in fp32): no weight-sized constant, no debug info.
    assert pte.size < weights + 20_000, (pte.size, weights)

    prompt = prompt_tokens()
    with torch.no_grad():
        expected = model(prompt).logits
    verify.reset_state(path)
    report = verify.check(path, expected, prompt, torch.arange(8))  # one forward call, T = 8
    assert report.outputs[0].rtol == (1e-4 if dtype == torch.float32 else 1e-2)
    report.raise_for_mismatch()

    start = prompt[0, :5].tolist()
    got = hf.greedy_decode(path, start, 8, SHAPES)  # one prefill call, then T = 1 steps
    assert_hf_greedy(got[5:], model, start, 8)


@pytest.mark.slow
def test_a_call_above_the_prefill_chunk_is_refused_by_executorchs_runtime(exported):
    _, path = exported("llama", torch.float32, SHAPES)
    verify.reset_state(path)
    # ExecuTorch will not resize an input past its exported upper bound: InvalidArgument (0x10), no output.
    # Its message does not name the limit; hf.check_call does (test_a_call_above_the_prefill_chunk_is_refused_naming_the_limit).
    with pytest.raises(RuntimeError, match=r"set_inputs\(\) for method 'forward' failed with error 0x10"):
        verify.run(path, torch.zeros(1, 9, dtype=torch.long), torch.arange(9))


def runner_tokens(path, prompt: str, new_tokens: int) -> list[int]:
    """ExecuTorch's own TextLLMRunner on the .pte (host backend), its greedy output as token ids."""
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    from coreai_partitioner import load_runtime_backend

    load_runtime_backend()
    runner = TextLLMRunner(str(path), str(path.parent / "tokenizer.json"))
    pieces: list[str] = []
    config = GenerationConfig(max_new_tokens=new_tokens, temperature=0.0, echo=False)
    runner.generate(prompt, config, token_callback=pieces.append)
    return [ord(c) if ord(c) < 0x100 else ord(c) - 0x100 for c in "".join(pieces)]


@pytest.mark.slow
@pytest.mark.parametrize("kind, dtype", [("llama", torch.float32), ("qwen3", torch.float16)])
def test_text_llm_runner_generates_hf_greedy_tokens_from_the_pte(kind, dtype, exported):
    model, path = exported(kind, dtype, SHAPES)
    prompt = "Hello, Core AI"
    ids = hf.byte_tokenizer(model.config).encode(prompt).ids
    assert_hf_greedy(runner_tokens(path, prompt, 10), model, ids, 10)


def enumerated_greedy(path, prompt: list[int], new_tokens: int, shapes: hf.DecoderShapes) -> tuple[list[int], torch.Tensor]:
    """Greedy decoding from an enumerated .pte's asset: its T = chunk and T = 1 functions, one shared KV cache.

    Returns the tokens and the logits of the first (padded) prefill call.
    """
    from coreai.authoring import AIModelAsset

    (delegate,) = read_pte(path).coreai_delegates("forward")
    with tempfile.TemporaryDirectory() as directory:
        asset_path = delegate.asset_path(directory)
        names = AIModelAsset.load(asset_path).summary().function_names
        asset = LoadedAsset(asset_path)  # dispatches on the input shapes
    assert sorted(names) == [f"main_{symbol}_{t}" for symbol in {n.split("_")[1] for n in names} for t in (1, shapes.prefill_chunk)]
    state = asset.new_state()

    def forward(tokens: list[int], start: int) -> np.ndarray:
        inputs = dict(zip(asset.input_names, (np.array([tokens], np.int32), np.arange(start, start + len(tokens), dtype=np.int32))))
        return asset(inputs, state)[asset.output_names[-1]]

    tokens, first = list(prompt), None
    for chunk, positions, used in hf.prefill_calls(prompt, 0, shapes):
        logits = forward(chunk[0].tolist(), int(positions[0]))
        first = logits if first is None else first
        last = logits[0, used - 1]
    for _ in range(new_tokens):
        tokens.append(int(last.argmax()))
        last = forward([tokens[-1]], len(tokens) - 1)[0, -1]
    asset.close()
    return tokens, torch.from_numpy(first)


@pytest.mark.slow
@pytest.mark.parametrize("kind, dtype", ENUMERATED_CASES)
def test_enumerated_pte_has_one_asset_with_t_1_and_t_chunk_sharing_the_weights_and_hf_greedy_tokens(kind, dtype, exported):
    model, path = exported(kind, dtype, ENUMERATED)
    pte = read_pte(path)
    assert [d.method for d in pte.delegates] == ["forward"]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert pte.size < weights + 48_000, (pte.size, weights)  # one copy of the weights under two entrypoints

    prompt = prompt_tokens()
    with torch.no_grad():
        expected = model(prompt).logits
    tokens, first = enumerated_greedy(path, prompt[0].tolist(), 1, ENUMERATED)  # one T = 8 call
    rtol, atol = verify.default_tolerances(dtype)
    torch.testing.assert_close(first.to(dtype), expected, rtol=rtol, atol=atol)

    start = prompt[0, :5].tolist()  # padded to the chunk, then T = 1 steps
    got, _ = enumerated_greedy(path, start, 8, ENUMERATED)
    assert_hf_greedy(got[5:], model, start, 8)


@pytest.mark.slow
def test_enumerated_pte_runs_in_executorchs_runtime(exported):
    model, path = exported("llama", torch.float32, ENUMERATED)
    start = prompt_tokens()[0, :5].tolist()
    assert_hf_greedy(hf.greedy_decode(path, start, 8, ENUMERATED)[5:], model, start, 8)
