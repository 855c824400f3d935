"""Hugging Face Llama, Qwen2 and Qwen3 with Core AI composites, checked against HF eager."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from coreai_torch import get_decomp_table  # noqa: E402
from helpers import asset_ir, lower, to_pte  # noqa: E402

from coreai_partitioner import default_specs, externalize_modules, hf, verify  # noqa: E402
from coreai_partitioner.assets import summarize_ir  # noqa: E402

PROMPT_LEN = 8


def tiny(kind: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(hf.tiny_config(kind)).to(dtype).eval()


def export(program: torch.nn.Module, *sample: torch.Tensor, before_export=None):
    def export_fn(module):
        if before_export is not None:
            before_export()
        with torch.no_grad():
            return torch.export.export(module, sample).run_decompositions(get_decomp_table())

    return externalize_modules(program.eval(), default_specs(), export_fn=export_fn)


def prompt(model: torch.nn.Module) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(1))


def lowered_prefill(model: torch.nn.Module, tokens: torch.Tensor, before_export=None):
    with hf.coreai_composites(model):
        ep, records = export(hf.PrefillProgram(model), tokens, before_export=before_export)
    return lower(ep, records)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, dtype, norms",
    [
        # Qwen2 and Mistral, and Llama in fp16, run through the decoder in test_llm.py.
        ("llama", torch.float32, 5),  # 2 per layer + the final norm
        ("qwen3", torch.float32, 9),  # and q_norm, k_norm per layer
        ("qwen3", torch.float16, 9),
    ],
)
def test_prefill_keeps_composites_and_matches_hf_eager(kind, dtype, norms):
    model = tiny(kind, dtype)
    tokens = prompt(model)
    lowered = lowered_prefill(model, tokens)

    composites = sum(
        (summarize_ir(asset_ir(d)).composites() for d in to_pte(lowered).delegates), start=__import__("collections").Counter()
    )
    assert composites["rms_norm"] == norms
    assert composites["scaled_dot_product_attention"] == 2
    assert composites["rope"] == 4  # q and k in each layer
    with torch.no_grad():
        expected = model(tokens).logits  # the original HF modules again
    report = verify.check(lowered, expected, tokens, method="forward")
    assert report.outputs[0].rtol == (1e-4 if dtype == torch.float32 else 1e-2)
    report.raise_for_mismatch()


@pytest.mark.slow
def test_int8_weights_lower_and_match_the_quantized_eager_model():
    from coremltools.optimize.torch.quantization import PostTrainingQuantizer, PostTrainingQuantizerConfig

    model = tiny("qwen2")
    tokens = prompt(model)
    original = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    config = PostTrainingQuantizerConfig.from_dict({"global_config": {"weight_dtype": "int8", "granularity": "per_channel"}})

    lowered = lowered_prefill(model, tokens, before_export=lambda: PostTrainingQuantizer(model, config).compress(inplace=True))

    quantized = model.model.layers[0].mlp.up_proj.weight
    assert not torch.equal(quantized, original)
    assert max(len(torch.unique(row)) for row in quantized) <= 256
    with torch.no_grad():
        expected = model(tokens).logits
    verify.check(lowered, expected, tokens).raise_for_mismatch()


def test_swaps_are_undone_on_exit():
    model = tiny("qwen3")
    modeling = __import__("sys").modules[type(model.model.layers[0].self_attn).__module__]
    rope_before = modeling.apply_rotary_pos_emb
    norms_before = [type(m).__name__ for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    implementation = model.config._attn_implementation

    with hf.coreai_composites(model) as swaps:
        assert len(swaps.rms_norms) == 9 and len(swaps.attention) == 2 and swaps.rope
        assert modeling.apply_rotary_pos_emb is not rope_before
        assert model.config._attn_implementation == hf.ATTENTION

    assert modeling.apply_rotary_pos_emb is rope_before
    assert [type(m).__name__ for m in model.modules() if type(m).__name__.endswith("RMSNorm")] == norms_before
    assert model.config._attn_implementation == implementation
    assert not hasattr(model, "coreai_rope")
    assert not any(hasattr(m, "coreai_sdpa") for m in model.modules())


def test_unknown_architecture_is_refused_with_the_way_out():
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match="model_type 'gpt2'.*ExternalizeSpec"):
        with hf.coreai_composites(model):
            pass
