"""Weight quantization between externalize_modules and lowering (coreai_partitioner.quantize): the int schemes give
coreai-opt's integers and scales without its graph mode.

Every test here lowers a model or runs coreai-opt's export, so the module is slow.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter

import pytest
import torch

from helpers import run_pte
from requires import require

require("transformers", "hf")
require("coreai_opt", "quantize")

from coreai_torch import get_decomp_table  # noqa: E402
from executorch.exir import to_edge_transform_and_lower  # noqa: E402

from coreai_partitioner import (  # noqa: E402
    CoreAIPartitioner,
    default_specs,
    externalize_modules,
    get_default_compile_config,
    verify,
)
from coreai_partitioner import text_generation as coreai_llm  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.asset_ir import asset_ir, summarize_ir  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte  # noqa: E402
from coreai_partitioner.quantize import DECOMPRESS_OP, LUT_OP, QuantizationError, quantize  # noqa: E402
from coreai_partitioner.verify import check_quantized  # noqa: E402

pytestmark = pytest.mark.slow

SHAPES = coreai_llm.DecoderShapes(max_context_len=24, prefill_chunk=8, verify_len=0)  # forward's composites counted in the asset alone; verify's are tests/test_speculative.py's
COMPOSITES = ("rms_norm", "scaled_dot_product_attention", "rope")


def _lower(program, records):
    from coreai_partitioner.lowering.passes import get_default_passes

    return to_edge_transform_and_lower(
        program,
        partitioner=[CoreAIPartitioner(externalized_modules=records)],
        compile_config=get_default_compile_config(),
        transform_passes=get_default_passes(),
    )


def _composites_and_ir(pte_bytes: bytes) -> tuple[Counter, str]:
    counts: Counter = Counter()
    irs = []
    with tempfile.TemporaryDirectory() as directory:
        for delegate in read_pte(pte_bytes).delegates:
            ir = asset_ir(delegate.asset_path(directory))
            counts.update(summarize_ir(ir).composites())
            irs.append(ir)
    return counts, "\n".join(irs)


class QuantizedLLM:
    """A tiny HF model's decoder (``forward(tokens, input_pos)``, T symbolic), float and quantized, lowered."""

    def __init__(self, kind: str, scheme: str) -> None:
        self.scheme = scheme
        torch.manual_seed(0)
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_config(coreai_llm.tiny_config(kind)).eval()
        self.prompt = torch.randint(0, self.model.config.vocab_size, (1, SHAPES.prefill_chunk))
        tokens = torch.export.Dim("T", min=1, max=SHAPES.prefill_chunk)
        dynamic_shapes = ({1: tokens}, {0: tokens})
        sample = (torch.zeros(1, 2, dtype=torch.long), torch.arange(2))
        self.float_model = coreai_llm.adapt(self.model, SHAPES, full_logits=True)
        with torch.no_grad():
            program, records = externalize_modules(
                self.float_model, default_specs(),
                export_fn=lambda m: torch.export.export(m, sample, dynamic_shapes=dynamic_shapes),
            )
        quantized = quantize(program, scheme, records=records, dynamic_shapes=dynamic_shapes)
        self.eager = quantized.module()  # before lowering, which takes the program's constants over
        self.lowered = _lower(quantized, records)
        self.pte = bytes(self.lowered.to_executorch().buffer)
        self.float_pte = bytes(_lower(program.run_decompositions(get_decomp_table()), records).to_executorch().buffer)


_empty_cache = coreai_llm.reset_state


_built: dict[tuple[str, str], QuantizedLLM] = {}


# Qwen2 int8 runs the same path as Llama int8 (checked by hand with examples/export_llm.py --verify).
@pytest.fixture(scope="module", params=[("llama", "int8"), ("qwen3", "int4")], ids="-".join)
def llm(request) -> QuantizedLLM:
    if request.param not in _built:
        _built.clear()  # one model's programs in memory at a time
        _built[request.param] = QuantizedLLM(*request.param)
    return _built[request.param]


def test_quantized_pte_keeps_every_composite_call_site(llm):
    quantized, _ = _composites_and_ir(llm.pte)
    original, _ = _composites_and_ir(llm.float_pte)
    assert {name: quantized[name] for name in COMPOSITES} == {name: original[name] for name in COMPOSITES}
    assert all(original[name] > 0 for name in COMPOSITES), original


def test_quantized_asset_stores_weights_compressed(llm):
    _, ir = _composites_and_ir(llm.pte)
    _, float_ir = _composites_and_ir(llm.float_pte)
    bits = 4 if llm.scheme == "int4" else 8
    assert "coreai.blockwise_shift_scale" in ir and "coreai.blockwise_shift_scale" not in float_ir
    assert re.search(rf"dense_resource<\w+> : tensor<[0-9x]+xsi{bits}>", ir)  # the weight blob itself is int
    assert len(llm.pte) < 0.8 * len(llm.float_pte)


def test_quantized_prefill_matches_quantized_eager_and_reports_the_float_error(llm):
    positions = torch.arange(SHAPES.prefill_chunk)
    with torch.no_grad():
        expected = _empty_cache(llm.eager)(llm.prompt, positions)
    reference = coreai_llm.adapt(llm.model, SHAPES, full_logits=True)
    with torch.no_grad():
        float_logits = reference(llm.prompt, positions)
    verify.reset_state(llm.lowered)
    report = check_quantized(llm.lowered, expected, float_logits, llm.prompt, positions, rtol=1e-3, atol=1e-3)
    report.raise_for_mismatch()
    float_error = report.against_float.outputs[0].max_abs_error
    assert float_error > 10 * report.against_quantized.outputs[0].max_abs_error, str(report)


def test_quantized_greedy_tokens_equal_quantized_eager(llm):
    prompt = llm.prompt[0, :5].tolist()
    got = coreai_llm.greedy_decode(llm.lowered, prompt, 8, SHAPES)
    eager = _empty_cache(llm.eager)
    tokens = list(prompt)
    with torch.no_grad():
        logits = eager(torch.tensor([prompt]), torch.arange(len(prompt)))
        while len(tokens) < len(prompt) + 8:
            tokens.append(int(logits[0, -1].argmax()))
            logits = eager(torch.tensor([[tokens[-1]]]), torch.tensor([len(tokens) - 1]))
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


class _Cache(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)
        self.register_buffer("key_cache_0", torch.zeros(4, 32), persistent=False)

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.key_cache_0.index_copy_(0, position, self.proj(x))
        return self.key_cache_0.sum(0)


def test_quantize_leaves_the_kv_cache_as_it_was():
    model = _Cache()
    with torch.no_grad():
        program, records = externalize_modules(
            model, [], export_fn=lambda m: torch.export.export(m, (torch.randn(2, 32), torch.arange(2)))
        )
    quantized = quantize(program, "int8", records=records)
    assert model.key_cache_0.abs().sum() == 0
    cache = quantized.state_dict.get("key_cache_0", quantized.constants.get("key_cache_0"))
    assert cache.abs().sum() == 0


# ---------------------------------------------------------------- mixtures of experts


@pytest.mark.slow
def test_int4_moe_stores_its_experts_compressed_and_generates_the_quantized_eager_tokens(tmp_path):
    from llm_helpers import tiny

    model = tiny("mixtral")  # every layer a mixture of 8 experts, expert width 24 (int4 blocks of 8 there)
    shapes = coreai_llm.DecoderShapes(max_context_len=32, prefill_chunk=16)
    reference: list = []
    quantized = tmp_path / "int4.pte"
    quantized.write_bytes(coreai_llm.lower_decoder(model, shapes, quantize="int4", quantized_reference=reference).to_executorch().buffer)
    plain = tmp_path / "fp32.pte"
    plain.write_bytes(coreai_llm.lower_decoder(model, shapes).to_executorch().buffer)

    counts, ir = _composites_and_ir(quantized.read_bytes())
    assert counts["gather_mm"] == 4
    for shape in ("8x48x64", "8x64x24"):  # gate_up [E, 2I, H] and down [E, H, I], stored as 4-bit integers
        assert re.search(rf"dense_resource<\w+> : tensor<{shape}xsi4>", ir), shape
    # fp32 is 4 bytes a weight, int4 half a byte and a scale per block: about 1/8 of the weights, plus the program.
    assert quantized.stat().st_size < 0.3 * plain.stat().st_size, (quantized.stat().st_size, plain.stat().st_size)

    eager = coreai_llm.reset_state(reference[0])
    prompt = list(range(3, 15))
    tokens = list(prompt)
    with torch.no_grad():
        logits = eager(torch.tensor([tokens]), torch.arange(len(tokens)))
        for _ in range(8):
            tokens.append(int(logits[0, -1].argmax()))
            logits = eager(torch.tensor([[tokens[-1]]]), torch.tensor([len(tokens) - 1]))
    assert coreai_llm.greedy_decode(quantized, prompt, 8, shapes, eos_ids=()) == tokens


# ---------------------------------------------------------------- weights a scheme cannot store stay float


class _StemCNN(torch.nn.Module):
    """A 3-channel stem (no int4 block of 32 divides its inputs, no table per 32 its 16 outputs), a body, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.body = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.head = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.body(torch.relu(self.stem(x))))
        return self.head(x.mean((2, 3)))


@pytest.mark.parametrize("scheme, kept, op", [("int4", "stem, body", DECOMPRESS_OP), ("palettize4", "stem", LUT_OP)])
def test_a_stem_convolution_a_scheme_cannot_store_stays_float_with_a_warning_and_the_pte_runs_as_quantized_eager(scheme, kept, op):

    from coreai_partitioner import lower

    torch.manual_seed(0)
    model, x = _StemCNN().eval(), torch.randn(1, 3, 16, 16)
    held = []
    hold = lambda program: held.append(program.module()) or program  # noqa: E731 - the quantized eager model, before lowering
    with pytest.warns(UserWarning, match=rf"the {scheme} scheme cannot store .* kept float: stem \(\[16, 3, 3, 3\]") as caught:
        lowered = lower(model, (x,), quantize=scheme, transform=hold)
    said = [str(w.message) for w in caught if "cannot store" in str(w.message)]
    assert len(said) == 1 and re.findall(r"(\w+) \(\[", said[0]) == kept.split(", "), said
    compressed = [n for n in held[0].graph.nodes if op in str(n.target)]
    assert len(compressed) == 3 - len(kept.split(", ")), held[0].graph  # every other layer stored compressed

    actual = run_pte(lowered.to_executorch().buffer, [x])[0]
    with torch.no_grad():
        expected, float_output = held[0](x), model(x)
    torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-4)
    assert (float_output - expected).abs().max() > 10 * (actual - expected).abs().max()  # the weights really are quantized


@pytest.mark.slow
def test_a_decoders_short_convolution_int4_cannot_store_stays_float_with_one_warning_and_the_pte_runs():
    """LFM2's short convolutions have one input channel a weight, which no int4 block of 32 divides: the export keeps
    them float, as for any model, instead of refusing the whole decoder."""
    from llm_helpers import tiny

    torch.manual_seed(0)
    model = tiny("lfm2")
    shapes = coreai_llm.DecoderShapes(max_context_len=16, prefill_chunk=4)
    with pytest.warns(UserWarning, match=r"the int4 scheme cannot store \d+ layer\(s\), kept float: .*conv") as caught:
        lowered = coreai_llm.lower_decoder(model, shapes, quantize="int4")
    assert len([w for w in caught if "cannot store" in str(w.message)]) == 1
    tokens = torch.tensor([[5, 6, 7, 8]])
    actual = run_pte(lowered.to_executorch().buffer, [tokens, torch.arange(4)])[0]
    assert torch.isfinite(actual).all() and actual.shape[-1] == model.config.vocab_size


class _CamelCase(torch.nn.Module):
    """A layer under a CamelCase name, as transformers' T5 names its attention (``SelfAttention``)."""

    def __init__(self) -> None:
        super().__init__()
        self.SelfAttention = torch.nn.Linear(32, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.SelfAttention(x)


@pytest.mark.parametrize("scheme", ["palettize4", "int8"])
def test_a_weight_under_a_camel_case_module_name_is_stored_compressed_and_the_converter_finds_it(scheme):
    # FX snake-cases the names of the placeholders it makes; coreai-torch finds a buffer by the placeholder's target.
    # The tasks' tail (lower_method_modules) hands the converter those placeholders as they are.
    from coreai_partitioner.lowering.lower import to_executorch
    from coreai_partitioner.lowering.methods import lower_method_modules

    torch.manual_seed(0)
    model, x = _CamelCase().eval(), torch.randn(1, 4, 32)
    held: dict = {}
    lowered = lower_method_modules({"forward": model}, {"forward": (x,)}, device=False, constant_methods={},
                                   quantize=scheme, quantized_reference=held)
    actual = run_pte(to_executorch(lowered).buffer, [x])[0]
    with torch.no_grad():
        expected = held["forward"](x)
    torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-4)
    assert (model(x) - expected).abs().max() > 0  # the weight really is stored compressed


def test_a_sequential_whose_input_torch_export_names_input_lowers_quantized_and_runs_as_quantized_eager():
    # nn.Sequential's forward takes ``input``: a copy of its graph renamed that placeholder "input_1", and the
    # quantized program's signature no longer named it (SpecViolationError) until the copy kept the names
    from coreai_partitioner import lower
    from coreai_partitioner.quantize import quantize

    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)).eval(), torch.randn(2, 64)
    actual = run_pte(lower(model, (x,), quantize="int8").to_executorch().buffer, [x])[0]
    expected = quantize(torch.export.export(model, (x,)), "int8").module()(x)
    torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-4)


# ---------------------------------------------------------------- coreai-opt's integers without its graph mode


class _Layers(torch.nn.Module):
    """An embedding, a convolution and two Linear layers: every kind of weight the int schemes store."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 64)
        self.conv = torch.nn.Conv2d(64, 64, 3, padding=1)
        self.up = torch.nn.Linear(64, 96)
        self.down = torch.nn.Linear(96, 64, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.conv(self.embed(tokens).transpose(1, 2).reshape(1, 64, 4, 4)).flatten(2).transpose(1, 2)
        return self.down(torch.relu(self.up(x)))


@pytest.mark.parametrize("scheme, dtype", [("int8", torch.float32), ("int4", torch.float32), ("int4-channel", torch.float16)])
def test_int_schemes_store_coreai_opts_integers_and_scales_bit_for_bit(scheme, dtype):
    from coreai_partitioner.quantize.coreai_opt import quantize_with_coreai_opt
    from coreai_partitioner.quantize.packed_int4 import unpack
    from coreai_partitioner.quantize.schemes import scheme as scheme_of

    torch.manual_seed(0)
    model = _Layers().eval().to(dtype)
    tokens = torch.randint(0, 64, (1, 16))
    with torch.no_grad():
        program, records = externalize_modules(model, [], export_fn=lambda m: torch.export.export(m, (tokens,)))
    ours = quantize(program, scheme, records=records)
    theirs = quantize_with_coreai_opt(program, scheme_of(scheme), records, None, None, (), get_decomp_table())

    stored = {name: tensor for name, tensor in ours.state_dict.items() if name.endswith(("_quantized", "_scale"))}
    assert len(stored) == 8
    packed = []
    for name, tensor in stored.items():  # coreai-opt names them after the parameter, its dots as underscores
        reference = theirs.state_dict[name.replace(".", "_")]
        if tensor.dtype == torch.uint8:  # int4 held two a byte (packed_int4); coreai-opt's program holds a byte each
            assert tensor.shape[-1] * 2 == reference.shape[-1], name
            tensor = unpack(tensor)
            packed.append(name)
        assert tensor.dtype == reference.dtype and torch.equal(tensor, reference), name
    assert len(packed) == (2 if scheme.startswith("int4") else 0), packed  # the Linears (a 3-wide kernel row stays unpacked)
    with torch.no_grad():
        torch.testing.assert_close(ours.module()(tokens), theirs.module()(tokens), rtol=0, atol=0)
