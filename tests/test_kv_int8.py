"""Int8 KV caches (``lower_decoder(kv_cache="int8")``, ``--kv-cache int8``): keys and values stored int8 with a scale
per token and head, host and device forms, against Hugging Face eager.

Int8 caches change the logits, so the tokens are judged with a tie margin of
their own (:data:`INT8_TIE`): a greedy token may differ from HF's only where
HF's top two logits are closer than that, and must then be HF's second.
``test_int8_caches_keep_every_family_near_hf_eager`` measures how far the
logits move (at most 0.04 of these tiny models' logits, Gemma 4's; most
families under 0.01), and the margin is 2.5 times that.
"""

from __future__ import annotations

import pytest
import torch

from requires import require

require("transformers", "hf")

from llm_helpers import ROWS, assert_hf_greedy, ci_sample, prompt_tokens, tiny  # noqa: E402

from coreai_partitioner import save_pte, text_generation  # noqa: E402
from coreai_partitioner.blocks.quantized_cache import kv_cache_bytes, quantize_kv_caches, quantize_rows  # noqa: E402

#: How far int8 caches may move a tiny model's logits (docs/long-context.md states it).
INT8_LOGITS = 0.05
#: Logit margins below which two tokens tie under int8 caches.
INT8_TIE = 0.1
#: Families whose attention keeps a KV cache (every family does; the hybrids beside recurrent layers too).
KV_FAMILIES = sorted(ROWS)

SHAPES = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=24)
DEVICE = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=4, target="device")
PROMPT = 11
NEW_TOKENS = 10


def test_rows_quantize_to_int8_values_within_half_a_step_of_their_scale():
    states = torch.randn(1, 2, 5, 16) * torch.tensor([1e-3, 1.0, 30.0, 0.0, 2.0]).view(1, 1, 5, 1)
    values, scale = quantize_rows(states)
    assert scale.shape == (1, 2, 5, 1)
    assert torch.equal(values, values.round()) and values.abs().max() <= 127
    assert ((values * scale - states).abs() <= scale / 2 + 1e-7).all()
    assert torch.equal(values[:, :, 3], torch.zeros_like(values[:, :, 3]))  # an all-zero row stays zero


def test_int8_caches_are_int8_with_a_scale_per_token_and_head_and_recurrent_state_is_left_alone():
    decoder = text_generation.adapt(tiny("qwen3_5_text"), SHAPES)
    before = {name: b.dtype for name, b in decoder.named_buffers()}
    floats = kv_cache_bytes(decoder)
    quantize_kv_caches(decoder, "int8")
    after = dict(decoder.named_buffers())
    keys = [name for name in after if name.endswith(".key_cache")]
    assert keys and all(after[name].dtype == torch.int8 for name in keys)
    for name in keys:
        assert after[name.replace("key_cache", "key_scale_cache")].shape == (*after[name].shape[:-1], 1)
    states = [name for name in after if name.endswith("_state")]
    assert states and all(after[name].dtype == before[name] for name in states)
    head_dim = after[keys[0]].shape[-1]
    assert kv_cache_bytes(decoder) == floats * (head_dim + 4) // (4 * head_dim)  # fp32 caches: int8 plus fp32 scales


def test_an_unknown_kv_cache_layout_is_refused():
    with pytest.raises(ValueError, match="kv_cache 'int4': choose one of fp, int8"):
        quantize_kv_caches(text_generation.adapt(tiny("llama"), SHAPES), "int4")


@pytest.mark.parametrize("model_type", KV_FAMILIES)
def test_int8_caches_keep_every_family_near_hf_eager(model_type):
    """A prefill and single-token steps over int8 caches, after another prompt (position 0 starts over)."""
    model = tiny(model_type)
    tokens = prompt_tokens(PROMPT + 4)
    decoder = quantize_kv_caches(text_generation.adapt(model, SHAPES, full_logits=True), "int8")
    with torch.no_grad():
        expected = model(tokens).logits
        decoder(prompt_tokens(PROMPT, seed=2), torch.arange(PROMPT))
        got = [decoder(tokens[:, :PROMPT], torch.arange(PROMPT))]
        got += [decoder(tokens[:, t : t + 1], torch.tensor([t])) for t in range(PROMPT, PROMPT + 4)]
    torch.testing.assert_close(torch.cat(got, 1), expected, rtol=0, atol=INT8_LOGITS)


def nan_and_noise_initial_caches(lowered) -> int:
    """Ship memory never written as every cache's initial value: NaN in a float buffer, any byte (-128 too) in an
    int8 one (ExecuTorch's ``et_init_buffer``); returns how many int8 buffers.  A test-only export."""
    int8 = 0
    for method in lowered.methods:
        program = lowered.exported_program(method)
        signature = program.graph_signature
        mutated = set(signature.buffers_to_mutate.values())
        for node in program.graph.nodes:
            name = signature.inputs_to_buffers.get(node.name) if node.op == "placeholder" else None
            if name in mutated:
                buffer = program.state_dict[name] if name in program.state_dict else program.constants[name]
                if buffer.dtype == torch.int8:
                    buffer.copy_(torch.randint(-128, 128, buffer.shape, generator=torch.Generator().manual_seed(0)))
                    int8 += 1
                else:
                    buffer.fill_(float("nan"))
                node.meta["et_init_buffer"] = True
    return int8


@pytest.mark.slow
@pytest.mark.parametrize(
    "shapes, model_type",
    # CI's: sliding windows with KV sharing in the host form, gated delta rules beside full attention in the device
    # form; the other rows (dense, attention sinks with experts among them) in the tier.
    ci_sample([(s, m) for s in (SHAPES, DEVICE) for m in KV_FAMILIES], [(SHAPES, "gemma4_text"), (DEVICE, "qwen3_5_text")],
              several_names=True),
    ids=lambda value: {id(SHAPES): "host", id(DEVICE): "device"}.get(id(value), value),
)
def test_int8_kv_pte_gives_hf_greedy_tokens(model_type, shapes, tmp_path):
    model = tiny(model_type)
    lowered = text_generation.lower_decoder(model, shapes, kv_cache="int8")
    if shapes.device:  # the program's own buffers: int8, from memory that may hold anything
        assert nan_and_noise_initial_caches(lowered) > 0
    path = save_pte(lowered, tmp_path / "model.pte")
    start = prompt_tokens(PROMPT)[0].tolist()
    got = text_generation.greedy_decode(path, start, NEW_TOKENS, shapes)[PROMPT:]
    assert_hf_greedy(got, model, start, NEW_TOKENS, tie=INT8_TIE)


def planned_cache_bytes(program) -> tuple[int, list[int]]:
    """The bytes of the KV caches (and their scales) among the planned buffers of ``program``'s ``forward`` (an
    ``ExecutorchProgramManager``), read off its execution plan by their names; and the planned arenas' sizes."""
    from executorch.exir.schema import Tensor

    sizes = {1: 1, 4: 4, 5: 2, 6: 4, 7: 8}  # int8, int64, half, float, double (ExecuTorch's ScalarType)
    (plan,) = [p for p in program.executorch_program.execution_plan if p.name == "forward"]
    total = 0
    for value in plan.values:
        tensor = value.val
        info = getattr(tensor, "extra_tensor_info", None) if isinstance(tensor, Tensor) else None
        if info is not None and (info.fully_qualified_name or "").endswith("_cache"):
            total += sizes[int(tensor.scalar_type)] * int(torch.tensor(tensor.sizes).prod())
    return total, list(plan.non_const_buffer_sizes)


@pytest.mark.slow
def test_the_device_forms_int8_caches_plan_at_most_0_53_of_fp16_caches():
    """Head dim 64 (SmolLM2's): an int8 row and its fp16 scale are 66 bytes where fp16's are 128."""
    from test_llm_families import wider

    from coreai_partitioner.lowering.device import executorch_config

    model = wider("llama", hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64).to(torch.float16)
    shapes = text_generation.DecoderShapes(max_context_len=256, prefill_chunk=4, target="device")
    planned = {
        kv: planned_cache_bytes(text_generation.lower_decoder(model, shapes, kv_cache=kv).to_executorch(executorch_config()))
        for kv in ("fp", "int8")
    }
    fp16, int8 = planned["fp"][0], planned["int8"][0]
    assert fp16 == 2 * 2 * 2 * 256 * 64 * 2  # layers, K and V, KV heads, slots, head dim, bytes
    assert int8 <= 0.53 * fp16, (int8, fp16)
    assert int8 == fp16 * 66 // 128
