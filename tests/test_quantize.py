"""coreai-opt weight quantization between externalize_modules and lowering (coreai_partitioner.quantize).

Every test here lowers a model or runs coreai-opt's export, so the module is slow.
"""

from __future__ import annotations

import tempfile
from collections import Counter

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("coreai_opt")

from coreai_torch import get_decomp_table  # noqa: E402
from executorch.exir import to_edge_transform_and_lower  # noqa: E402

from coreai_partitioner import (  # noqa: E402
    CoreAIPartitioner,
    default_specs,
    externalize_modules,
    get_default_compile_config,
    get_default_passes,
    hf,
)
from coreai_partitioner.assets import asset_ir, summarize_ir  # noqa: E402
from coreai_partitioner.pte import read_pte  # noqa: E402
from coreai_partitioner.quantize import DECOMPRESS_OP, QuantizationError, check, quantize  # noqa: E402

pytestmark = pytest.mark.slow

PREFILL_LEN = 8
MAX_CACHE = 16
COMPOSITES = ("rms_norm", "scaled_dot_product_attention", "rope")


def _lower(programs: dict, records: dict):
    return to_edge_transform_and_lower(
        programs,
        partitioner={name: [CoreAIPartitioner(externalized_modules=r)] for name, r in records.items()},
        compile_config=get_default_compile_config(),
        transform_passes=get_default_passes(),
    )


def _composites_and_ir(pte_bytes: bytes, method: str) -> tuple[Counter, str]:
    pte = read_pte(pte_bytes)
    counts: Counter = Counter()
    irs = []
    with tempfile.TemporaryDirectory() as directory:
        for delegate in (d for d in pte.delegates if d.method == method):
            ir = asset_ir(delegate.asset_path(directory))
            counts.update(summarize_ir(ir).composites())
            irs.append(ir)
    return counts, "\n".join(irs)


class QuantizedLLM:
    """A tiny HF model's prefill and decode, float and quantized, lowered once per (kind, scheme)."""

    def __init__(self, kind: str, scheme: str) -> None:
        torch.manual_seed(0)
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_config(hf.tiny_config(kind)).eval()
        self.prompt = torch.randint(0, self.model.config.vocab_size, (1, PREFILL_LEN))
        step = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
        programs, quantized, records = {}, {}, {}
        with hf.coreai_composites(self.model):
            for name, module, sample in (
                ("prefill", hf.PrefillProgram(self.model), (self.prompt,)),
                ("decode", hf.StaticCacheDecoder(self.model, MAX_CACHE), step),
            ):
                with torch.no_grad():
                    programs[name], records[name] = externalize_modules(
                        module.eval(), default_specs(), export_fn=lambda m, s=sample: torch.export.export(m, s)
                    )
                quantized[name] = quantize(programs[name], scheme, records=records[name])
        self.eager = {name: program.module() for name, program in quantized.items()}
        self.float_prefill = programs["prefill"].run_decompositions(get_decomp_table())
        self.lowered = _lower(quantized, records)
        self.pte = bytes(self.lowered.to_executorch().buffer)
        self.float_pte = bytes(_lower({"prefill": self.float_prefill}, {"prefill": records["prefill"]}).to_executorch().buffer)


_built: dict[tuple[str, str], QuantizedLLM] = {}


@pytest.fixture(scope="module", params=[("llama", "int8"), ("qwen2", "int4"), ("qwen3", "int8"), ("qwen3", "int4")], ids="-".join)
def llm(request) -> QuantizedLLM:
    if request.param not in _built:
        _built.clear()  # one model's programs in memory at a time
        _built[request.param] = QuantizedLLM(*request.param)
    return _built[request.param]


def test_quantized_pte_keeps_every_composite_call_site(llm):
    quantized, _ = _composites_and_ir(llm.pte, "prefill")
    original, _ = _composites_and_ir(llm.float_pte, "prefill")
    assert {name: quantized[name] for name in COMPOSITES} == {name: original[name] for name in COMPOSITES}
    assert all(original[name] > 0 for name in COMPOSITES), original


def test_quantized_asset_stores_weights_compressed(llm):
    _, ir = _composites_and_ir(llm.pte, "prefill")
    _, float_ir = _composites_and_ir(llm.float_pte, "prefill")
    assert DECOMPRESS_OP in ir and DECOMPRESS_OP not in float_ir
    assert len(llm.pte) < 0.8 * len(llm.float_pte) * 2  # two methods, each with its own weights
    assert len(read_pte(llm.pte).delegates) == 2


def test_quantized_prefill_matches_quantized_eager_and_reports_the_float_error(llm):
    with hf.coreai_composites(llm.model):
        float_model = hf.PrefillProgram(llm.model).eval()
        report = check(llm.lowered, llm.eager["prefill"], float_model, llm.prompt, method="prefill", rtol=1e-3, atol=1e-3)
    report.raise_for_mismatch()
    float_error = report.against_float.outputs[0].max_abs_error
    assert float_error > 10 * report.against_quantized.outputs[0].max_abs_error, str(report)


def test_quantized_greedy_tokens_equal_quantized_eager(llm):
    prompt = llm.prompt[0, :4].tolist()
    got = hf.greedy_decode(llm.lowered, prompt, 8)
    decoder = llm.eager["decode"]
    tokens = list(prompt)
    with torch.no_grad():
        for position in range(len(prompt) + 7):
            logits = decoder(torch.tensor([[tokens[position]]]), torch.tensor([position]))
            if position >= len(prompt) - 1:
                tokens.append(int(logits[0, -1].argmax()))
    assert got == tokens


# ---------------------------------------------------------------- errors name the layer


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from coreai_torch.composite_ops import RMSNorm

        self.proj = torch.nn.Linear(32, 32)
        self.norm = RMSNorm(32)
        self.mixer = torch.nn.Parameter(torch.randn(32, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x)) @ self.mixer


def _tiny_program():
    with torch.no_grad():
        model = _Tiny().eval()
        return externalize_modules(model, default_specs(), export_fn=lambda m: torch.export.export(m, (torch.randn(2, 32),)))


def test_weight_coreai_opt_cannot_quantize_is_an_error_naming_it():
    program, records = _tiny_program()
    with pytest.raises(QuantizationError, match=r"mixer \(read by matmul") as error:
        quantize(program, "int8", records=records)
    assert "keep_float=['mixer']" in str(error.value)
    quantized = quantize(program, "int8", records=records, keep_float=["mixer"])
    assert sum(DECOMPRESS_OP in str(n.target) for n in quantized.graph.nodes) == 1


def test_config_asking_for_a_layer_inside_a_composite_is_an_error_naming_it():
    from coreai_opt.quantization import ModuleQuantizerConfig, QuantizerConfig

    program, records = _tiny_program()
    config = QuantizerConfig.presets.w8()
    config.module_name_configs = {"norm": ModuleQuantizerConfig.presets.w8()}
    with pytest.raises(QuantizationError, match=r"layer 'norm', which is inside the composite 'norm"):
        quantize(program, config, records=records, keep_float=["mixer"])


def test_decomposed_program_is_an_error_naming_the_linear_layers():
    program, records = _tiny_program()
    with pytest.raises(QuantizationError, match=r"proj\.weight \(read by permute.*quantize before run_decompositions"):
        quantize(program.run_decompositions(get_decomp_table()), "int8", keep_float=["mixer"])


def test_unknown_scheme_names_the_choices():
    program, _ = _tiny_program()
    with pytest.raises(ValueError, match="int8, int4"):
        quantize(program, "int3")
