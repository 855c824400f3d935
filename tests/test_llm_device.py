"""The device form (``lower_decoder(target="device")``), every family: what upstream's on-device runtime takes.

Each row reads the contract from the ``.pte`` itself (its execution plan,
its delegates' payloads and named data), not from our own report: every
delegate call passes fp16/fp32 tensors in the default dim order and nothing
else, of static shape or of a sequence dimension bounded by the prefill
chunk, the id is ``CoreAIBackend``, the packaging inline, one function per
delegate, no Core AI state, upstream's ``parse_manifest`` holds, and the
runner's metadata says to prefill in chunks.  Its caches start filled with
NaN (the initial value a test-only export ships), as memory never written
may hold.  Then it runs through ExecuTorch's runtime against Hugging Face
eager and ``generate`` until EOS, and through ExecuTorch's ``TextLLMRunner``,
which prefills a prompt longer than the chunk in calls of the chunk.
The static layout (``forward`` T = 1 beside ``prefill`` T = chunk) has rows
of its own.
"""

from __future__ import annotations

import tempfile
from collections import Counter

import pytest
import torch

from requires import require  # noqa: E402

require("transformers", "hf")

from llm_helpers import DEVICE_IN_CI, ROWS, assert_hf_greedy, ci_sample, prompt_tokens, tiny  # noqa: E402
from test_llm_families import wider  # noqa: E402
from device_contract import device_delegate_arguments  # noqa: E402

from coreai_partitioner import text_generation, save_pte, verify  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.asset_ir import asset_ir, summarize_ir  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte  # noqa: E402
from coreai_partitioner.text_decoder.device import UnsupportedDevice  # noqa: E402
from coreai_partitioner.text_generation.runner import Runner  # noqa: E402

CHUNK = 4
SHAPES = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=CHUNK, target="device", verify_len=0)  # forward's composites counted in the asset alone; verify's are tests/test_speculative.py's
STATIC = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=CHUNK, target="device", device_shapes="static", verify_len=0)  # forward's composites counted in the asset alone; verify's are tests/test_speculative.py's
PROMPT = 11  # calls of 4, 4 and 3 tokens (static: two prefill calls of 4, then three forward calls of 1)
NEW_TOKENS = 10
RUNNER_PROMPT = "Hello, Core AI"  # 14 tokens of the byte tokenizer: the runner prefills them in 4 calls


def assert_device_contract(path, methods=("forward",), chunk: int = CHUNK, bounded: bool = True) -> None:
    """What upstream's device runtime requires of every delegate, read off the .pte.

    ``bounded``: the bounded layout, its sequence dimension up to ``chunk`` (else every shape static).
    """
    for arguments in device_delegate_arguments(path, methods).values():
        for argument in arguments:
            assert argument.dynamism in (("STATIC", "DYNAMIC_BOUND") if bounded else ("STATIC",)), argument
        if bounded:  # the tokens and positions: T bounded by the chunk, the bound declared in the .pte
            assert {a.sizes for a in arguments if a.dynamism == "DYNAMIC_BOUND"} >= {(1, chunk), (chunk,)}
    metadata = {name: verify.run(path, method=name)[0] for name in ("get_max_seq_len", "enable_dynamic_shape")}
    assert metadata == {"get_max_seq_len": chunk, "enable_dynamic_shape": bounded}


def nan_initial_caches(lowered) -> int:
    """Ship NaN as every cache's initial value (ExecuTorch's ``et_init_buffer``), as memory never written may hold;
    returns how many buffers.  A test-only export: the device form itself ships no initial value."""
    filled = 0
    for method in lowered.methods:
        program = lowered.exported_program(method)
        signature = program.graph_signature
        mutated = set(signature.buffers_to_mutate.values())
        for node in program.graph.nodes:
            name = signature.inputs_to_buffers.get(node.name) if node.op == "placeholder" else None
            if name in mutated:
                (program.state_dict.get(name) if name in program.state_dict else program.constants[name]).fill_(float("nan"))
                node.meta["et_init_buffer"] = True
                filled += 1
    return filled


def asset_composites(path, method: str = "forward") -> Counter:
    (delegate, *_) = read_pte(path).coreai_delegates(method)
    with tempfile.TemporaryDirectory() as directory:
        return summarize_ir(asset_ir(delegate.asset_path(directory))).composites()


def runner_tokens(directory, prompt: str, new_tokens: int, prefill_calls: int | None = None) -> list[int]:
    """ExecuTorch's own TextLLMRunner on the .pte (host backend), its greedy output as token ids; ``prefill_calls``
    is how many calls its prefill must have taken (its log says)."""
    lines: list[str] = []
    result = Runner(directory / "model.pte", directory / "tokenizer.json").generate(
        prompt, max_new_tokens=new_tokens, log=lines.append
    )
    if prefill_calls is not None:
        assert sum("Prefill token result" in line for line in lines) == prefill_calls, lines
    return [ord(c) if ord(c) < 0x100 else ord(c) - 0x100 for c in result.text]


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ci_sample(sorted(ROWS), DEVICE_IN_CI))
def test_device_pte_keeps_the_stock_runtime_contract_on_nan_filled_caches_and_matches_hf_through_text_llm_runner(
    model_type, tmp_path
):
    model = tiny(model_type)
    lowered = text_generation.lower_decoder(model, SHAPES)
    assert nan_initial_caches(lowered) > 0
    path = save_pte(lowered, tmp_path / "model.pte")
    text_generation.byte_tokenizer(model.config).save(str(tmp_path / "tokenizer.json"))
    assert_device_contract(path)
    counts = asset_composites(path)  # the asset's one function invokes the family's composites
    assert {name: counts[name] for name in ROWS[model_type]} == ROWS[model_type]

    prompt = prompt_tokens(PROMPT)
    with torch.no_grad():
        expected = model(prompt).logits[:, -1:]
    for _ in range(2):  # at position 0 it starts over
        torch.testing.assert_close(text_generation.prefill(path, prompt[0].tolist(), SHAPES), expected, rtol=1e-4, atol=1e-5)

    start = prompt[0].tolist()
    got = text_generation.greedy_decode(path, start, NEW_TOKENS, SHAPES)  # stops at the .pte's EOS ids, as generate does
    assert_hf_greedy(got[PROMPT:], model, start, NEW_TOKENS)

    ids = text_generation.byte_tokenizer(model.config).encode(RUNNER_PROMPT).ids
    assert len(ids) > CHUNK
    calls = -(-len(ids) // CHUNK)
    assert_hf_greedy(runner_tokens(tmp_path, RUNNER_PROMPT, 6, prefill_calls=calls), model, ids, 6)


@pytest.mark.slow
def test_attention_reads_unwritten_cache_slots_as_zeros_so_a_nan_filled_cache_changes_nothing(tmp_path, monkeypatch):
    """Without the selection, the NaN-filled caches of the test above reach the logits: the test can fail."""
    from coreai_partitioner.text_decoder import device

    model = tiny("llama")
    prompt = prompt_tokens(PROMPT)[0].tolist()
    monkeypatch.setattr(device, "written_only", lambda cache, held: cache)  # weight every slot, as the mask alone does
    weighted = text_generation.lower_decoder(model, SHAPES)
    nan_initial_caches(weighted)
    assert torch.isnan(text_generation.prefill(save_pte(weighted, tmp_path / "weighted.pte"), prompt, SHAPES)).all()
    monkeypatch.undo()
    selected = text_generation.lower_decoder(model, SHAPES)
    nan_initial_caches(selected)
    assert torch.isfinite(text_generation.prefill(save_pte(selected, tmp_path / "selected.pte"), prompt, SHAPES)).all()


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ci_sample(["llama", "gemma3_text", "qwen3_5_text"], ["qwen3_5_text"]))
def test_the_static_layout_keeps_forward_at_one_token_beside_prefill_over_one_asset(model_type, tmp_path):
    """Dense, sliding and recurrent layers: whole chunks through ``prefill``, the rest and the runner through ``forward``."""
    model = tiny(model_type)
    lowered = text_generation.lower_decoder(model, STATIC)
    nan_initial_caches(lowered)
    path = save_pte(lowered, tmp_path / "model.pte")
    text_generation.byte_tokenizer(model.config).save(str(tmp_path / "tokenizer.json"))
    assert_device_contract(path, ("forward", "prefill"), bounded=False)
    start = prompt_tokens(PROMPT)[0].tolist()
    assert_hf_greedy(text_generation.greedy_decode(path, start, NEW_TOKENS, STATIC)[PROMPT:], model, start, NEW_TOKENS)
    ids = text_generation.byte_tokenizer(model.config).encode(RUNNER_PROMPT).ids
    # enable_dynamic_shape false: the runner's sequential prefill, a token a call, which logs no chunk
    assert_hf_greedy(runner_tokens(tmp_path, RUNNER_PROMPT, 6, prefill_calls=0), model, ids, 6)


@pytest.mark.slow
def test_device_fp16_pte_passes_fp16_caches_and_generates_hf_greedy_tokens(tmp_path):
    model = tiny("qwen3", torch.float16)
    path = save_pte(text_generation.lower_decoder(model, SHAPES), tmp_path / "model.pte")
    assert_device_contract(path)
    arguments = [a for plan in read_pte(path).plans.values() for c in plan.delegate_calls for a in plan.arguments(c)]
    assert {a.dtype for a in arguments} == {"HALF", "FLOAT"}  # caches and rows fp16; tokens, positions fp32
    start = prompt_tokens(PROMPT)[0].tolist()
    assert_hf_greedy(text_generation.greedy_decode(path, start, 8, SHAPES)[PROMPT:], model, start, 8)


@pytest.mark.slow
@pytest.mark.parametrize("shapes", [SHAPES, STATIC], ids=["bounded", "static"])
def test_device_pte_stores_the_weights_once_in_either_layout(shapes, tmp_path):
    model = wider("llama", hidden_size=256, intermediate_size=512, vocab_size=1024)
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    assert weights >= 1_000_000
    path = save_pte(text_generation.lower_decoder(model, shapes), tmp_path / "model.pte")
    assert_device_contract(path, tuple(shapes.methods()), bounded=shapes.bounded)
    assert read_pte(path).size <= 1.05 * weights, (read_pte(path).size, weights)


def test_a_prefill_chunk_longer_than_a_sliding_window_is_refused_before_export():
    model = tiny("mistral")  # every layer slides over 8 slots
    shapes = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=12, target="device")
    with pytest.raises(UnsupportedDevice, match=r"mistral: .*prefill_chunk 12 is longer than its smallest window \(8\); export with --prefill-chunk 8 or less"):
        text_generation.lower_decoder(model, shapes)


def test_the_device_form_refuses_enumerated_shapes_and_options_it_sets_itself():
    with pytest.raises(ValueError, match="the device form lays out its own shapes"):
        text_generation.DecoderShapes(mode="enumerated", target="device")
    with pytest.raises(ValueError, match="device shapes 'dynamic': choose one of bounded, static"):
        text_generation.DecoderShapes(target="device", device_shapes="dynamic")
    with pytest.raises(ValueError, match="the device form sets take_over_mutable_buffer itself"):
        text_generation.lower_decoder(tiny("llama"), SHAPES, take_over_mutable_buffer=True)


def test_bounded_calls_are_chunks_of_forward_and_static_ones_whole_chunks_then_single_tokens():
    calls = text_generation.prefill_calls(list(range(11)), 0, SHAPES)
    assert [(c[0].shape[1], c[1].tolist()[0], text_generation.method_for(c[0], SHAPES)) for c in calls] == [
        (4, 0, "forward"), (4, 4, "forward"), (3, 8, "forward")
    ]
    text_generation.check_call(torch.zeros(1, 3, dtype=torch.long), SHAPES)
    with pytest.raises(ValueError, match="forward got 5 tokens; it was exported for T from 1 to the prefill chunk 4"):
        text_generation.check_call(torch.zeros(1, 5, dtype=torch.long), SHAPES)
    calls = text_generation.prefill_calls(list(range(11)), 0, STATIC)
    assert [(c[0].shape[1], c[1].tolist()[0], text_generation.method_for(c[0], STATIC)) for c in calls] == [
        (4, 0, "prefill"), (4, 4, "prefill"), (1, 8, "forward"), (1, 9, "forward"), (1, 10, "forward")
    ]
    with pytest.raises(ValueError, match=r"takes 1 token \(forward\) or 4 \(prefill\), not 3"):
        text_generation.check_call(torch.zeros(1, 3, dtype=torch.long), STATIC)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_type, layers_per_delegate", ci_sample([("gemma3_text", 2), ("qwen3_5_text", 1)], [("gemma3_text", 2)], several_names=True)
)
def test_graph_breaks_make_a_delegate_per_n_layers_each_a_function_of_the_one_asset(model_type, layers_per_delegate, tmp_path):
    model = tiny(model_type)
    path = save_pte(text_generation.lower_decoder(model, SHAPES, graph_breaks=layers_per_delegate), tmp_path / "model.pte")
    pte = read_pte(path)
    count = model.config.num_hidden_layers // layers_per_delegate
    delegates = pte.coreai_delegates("forward")
    assert [d.manifest["function"] for d in delegates] == [f"forward_{i}" for i in range(count)]
    plan = pte.plans["forward"]
    for call in plan.delegate_calls:  # only fp16/fp32 tensors cross, between delegates too, T bounded
        assert {(a.kind, a.dtype) for a in plan.arguments(call)} == {("Tensor", "FLOAT")}
        assert {a.dynamism for a in plan.arguments(call)} <= {"STATIC", "DYNAMIC_BOUND"}
    assert len({d.manifest["hash"] for d in pte.coreai_delegates()}) == 1
    start = prompt_tokens(PROMPT)[0].tolist()
    with torch.no_grad():
        expected = model(torch.tensor([start])).logits[:, -1:]
    torch.testing.assert_close(text_generation.prefill(path, start, SHAPES), expected, rtol=1e-4, atol=1e-5)
    assert_hf_greedy(text_generation.greedy_decode(path, start, 8, SHAPES)[PROMPT:], model, start, 8)


def test_graph_breaks_are_refused_where_they_cannot_be_honoured():
    with pytest.raises(UnsupportedDevice, match=r"llama: graph breaks every 2 layer\(s\) of 2: give 1 to 1"):
        text_generation.lower_decoder(tiny("llama"), SHAPES, graph_breaks=2)
    with pytest.raises(UnsupportedDevice, match="gemma4_text: its shared-KV layers attend an earlier layer's keys"):
        text_generation.lower_decoder(tiny("gemma4_text"), SHAPES, graph_breaks=1)
    with pytest.raises(ValueError, match="graph breaks are the device form's"):
        text_generation.lower_decoder(tiny("llama"), text_generation.DecoderShapes(max_context_len=32, prefill_chunk=4), graph_breaks=1)


@pytest.mark.slow
def test_device_pte_stores_palettized_weights_once_and_generates_the_quantized_models_tokens(tmp_path):
    model = wider("llama", hidden_size=256, intermediate_size=1024, vocab_size=1024)
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    reference: list = []
    path = save_pte(text_generation.lower_decoder(model, SHAPES, quantize="palettize4", quantized_reference=reference), tmp_path / "model.pte")
    assert_device_contract(path)
    assert read_pte(path).size <= 0.30 * weights / 2, (read_pte(path).size, weights)  # <= 0.30x fp16: stored once
    start = prompt_tokens(PROMPT)[0].tolist()
    eager = text_generation.reset_state(reference[0])  # the quantized program's eager module, fed as the runner feeds it
    tokens, position = list(start), 0
    with torch.no_grad():
        for token in start:
            logits = eager(torch.tensor([[token]]), torch.tensor([position]))
            position += 1
        for _ in range(8):
            tokens.append(int(logits[0, -1].argmax()))
            logits = eager(torch.tensor([[tokens[-1]]]), torch.tensor([position]))
            position += 1
    assert text_generation.greedy_decode(path, start, 8, SHAPES, eos_ids=()) == tokens
