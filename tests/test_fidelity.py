"""Verify by the runtime's numerics: SNR as ExecuTorch and coremltools compute it, the rounding bound, near-ties,
and a tiny decoder's .pte against its eager model, passing, and against its broken twins, failing."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import pytest
import torch

from coreai_partitioner import text_generation, verify
from coreai_partitioner.verify import fidelity

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "fp16_accumulation.txt"


def test_snr_and_psnr_are_coremltools_compute_snr_and_psnr_without_its_floor():
    from coremltools.converters.mil.testing_utils import compute_snr_and_psnr

    generator = torch.Generator().manual_seed(0)
    expected = torch.randn(4, 300, generator=generator, dtype=torch.float64)
    actual = expected + 0.05 * torch.randn(4, 300, generator=generator, dtype=torch.float64)
    snr, psnr = fidelity.snr_psnr(actual, expected)
    theirs = compute_snr_and_psnr(actual.flatten().numpy(), expected.flatten().numpy())
    assert snr == pytest.approx(theirs[0], abs=1e-3) and psnr == pytest.approx(theirs[1], abs=1e-3)
    # coremltools adds 1e-10 to the noise power: small outputs an fp32 runtime matches to 1e-7 would cap near 84 dB.
    small = 0.1 * torch.randn(1000, generator=generator, dtype=torch.float64)
    near = small + 1e-8 * torch.randn(1000, generator=generator, dtype=torch.float64)
    assert compute_snr_and_psnr(near.numpy(), small.numpy())[0] < 81 < 110 < fidelity.snr_psnr(near, small)[0]
    assert fidelity.snr_psnr(small, small)[0] == math.inf


def test_snr_is_executorch_inspectors_numeric_gap():
    from executorch.devtools.inspector.numerical_comparator.snr_numerical_comparator import SNRComparator

    generator = torch.Generator().manual_seed(1)
    expected = torch.randn(2, 64, generator=generator) * 3
    actual = expected + 0.1 * torch.randn(2, 64, generator=generator)
    assert fidelity.snr_psnr(actual, expected)[0] == pytest.approx(SNRComparator().element_compare(expected, actual), abs=1e-3)


def test_a_shift_of_a_positions_logits_is_no_noise_once_centered():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(2))
    shifted = logits + torch.tensor([[5.0], [-2.0], [0.5]])
    threshold = fidelity.Threshold(snr=60.0)
    assert fidelity.compare([shifted], [logits], threshold).outputs[0].snr < 10  # raw: the shift is noise
    judged = fidelity.compare([shifted], [logits], threshold, logits=True).outputs[0]
    assert judged.snr > 90 and judged.ok  # float32 rounding of the shift only


def test_the_tolerance_is_the_rounding_bound_of_the_dtype_width_and_depth_less_the_gain():
    threshold = fidelity.runtime_threshold("fp16", width=1536, depth=31)  # SmolLM2-135M's widest K, 30 layers + lm_head
    bound = 2.0**-11 * math.sqrt(1536) * math.sqrt(31)
    assert threshold.snr == pytest.approx(-20 * math.log10(bound) - fidelity.GAIN_DB)
    assert threshold.tie == pytest.approx(fidelity.TIE_NOISES * bound) and threshold.psnr == -math.inf
    fp32 = fidelity.runtime_threshold(torch.float32, width=1536, depth=31)
    assert fp32.snr - threshold.snr == pytest.approx(20 * math.log10(2.0**13))  # 13 bits more mantissa: 78 dB
    # Wider and deeper models round more; their tolerance is looser, never a measured model's SNR.
    assert fidelity.runtime_threshold("fp16", width=3072, depth=31).snr < threshold.snr
    assert fidelity.runtime_threshold("fp16", width=1536, depth=62).snr < threshold.snr


def products_per_output(conv: torch.nn.Module) -> int:
    """The most products a convolution sums into one output, counted: all-ones weights over an all-ones input."""
    conv = copy.deepcopy(conv).double()
    with torch.no_grad():
        conv.weight.fill_(1.0)
        conv.bias.zero_()
        return int(conv(torch.ones(1, conv.in_channels, *[9] * (conv.weight.dim() - 2), dtype=torch.float64)).max())


CONVOLUTIONS = {
    "conv1d": torch.nn.Conv1d(6, 4, 5),
    "conv2d": torch.nn.Conv2d(8, 16, (3, 5)),
    "conv3d": torch.nn.Conv3d(4, 2, 3),
    "grouped": torch.nn.Conv2d(8, 16, 3, groups=2),
    "depthwise": torch.nn.Conv2d(8, 8, 3, groups=8),
    "transposed": torch.nn.ConvTranspose2d(8, 4, 3),
    "transposed, stride 2": torch.nn.ConvTranspose2d(8, 4, 3, stride=2),
    "transposed, grouped, strided, dilated": torch.nn.ConvTranspose2d(8, 6, (4, 3), stride=(2, 3), groups=2, dilation=(1, 2)),
    "transposed 1d, stride 3, dilation 2": torch.nn.ConvTranspose1d(3, 5, 5, stride=3, dilation=2),
    "transposed 3d": torch.nn.ConvTranspose3d(4, 4, 3),
}


@pytest.mark.parametrize("conv", list(CONVOLUTIONS.values()), ids=list(CONVOLUTIONS))
def test_a_convolutions_reduction_is_every_product_summed_into_one_output(conv):
    assert fidelity.reduction_length(conv) == products_per_output(conv)


def test_the_reduction_is_a_linears_inputs_nothing_for_an_embedding_and_the_longest_dimension_of_another_weight():
    assert fidelity.reduction_length(torch.nn.Linear(48, 16)) == 48
    assert fidelity.reduction_length(torch.nn.Conv2d(3, 16, 3)) == 27  # a stem: 3 channels times 3 x 3, not its width 3
    assert fidelity.reduction_length(torch.nn.Embedding(100, 8)) == 0  # a gather sums nothing
    experts = torch.nn.Module()
    experts.gate = torch.nn.Parameter(torch.zeros(4, 24, 64))  # the op reducing it is not known: its longest dim
    assert fidelity.reduction_length(experts, "gate") == 64


def test_a_tied_weight_takes_the_longer_reduction_and_an_embedding_adds_no_depth():
    model = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 100))
    model[2].weight = model[0].weight  # a lm_head tied to the embedding
    assert fidelity.reduction_lengths(model) == {"0.weight": 8, "1.weight": 8}
    assert fidelity.runtime_threshold_of(model, "fp16") == fidelity.runtime_threshold("fp16", width=8, depth=2)
    with pytest.raises(ValueError, match="Embedding has no weights an op reduces over.*threshold="):
        fidelity.runtime_threshold_of(torch.nn.Embedding(10, 4), "fp16")


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.body = torch.nn.Conv2d(16, 32, 3, padding=1, groups=2)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.body(torch.relu(self.stem(x))))
        return self.head(x.mean((2, 3)))


@pytest.mark.slow
def test_an_fp16_cnn_passes_verify_at_the_tolerance_of_its_widest_convolution():
    from coreai_partitioner import lower

    torch.manual_seed(0)
    model, x = SmallCNN().eval(), torch.randn(2, 3, 16, 16)
    report = verify.check(lower(model, (x,), dtype=torch.float16), copy.deepcopy(model).half(), x.half(), dtype=torch.float16)
    assert report.ok, report
    # body: 16 / 2 channels times 3 x 3 = 72 products an output, its kernel width 3 before
    assert report.outputs[0].threshold == fidelity.runtime_threshold("fp16", width=72, depth=3)


def test_the_rounding_bound_holds_every_matmul_the_benchmark_measured_on_the_runtime():
    """benchmarks/results/fp16_accumulation.txt: each matmul's error on the Core AI runtime, at fp16 and fp32, is at
    most u * sqrt(K), the bound the tolerance is built on."""
    rows = re.findall(r"^(?:linear|q @ k\^T|p @ v), K=(\d+)\s+(\S+)\s+\S+\s+\S+\s+(\S+)$", BENCHMARK.read_text(), re.M)
    assert len(rows) == 10, BENCHMARK.read_text()  # five matmuls, at each dtype
    for k, measured, bound in rows:
        assert float(measured) <= float(bound), (k, measured, bound)


def test_an_unknown_dtype_names_the_known_ones_and_the_fix():
    with pytest.raises(fidelity.UnknownPrecision, match="dtype 'bf16'.*fp32, fp16.*threshold="):
        fidelity.runtime_threshold(torch.bfloat16, width=64, depth=2)


def test_verify_check_refuses_an_unknown_dtype_before_running_anything():
    model = torch.nn.Linear(4, 4)
    with pytest.raises(fidelity.UnknownPrecision):
        verify.check(object(), model, torch.zeros(1), dtype=torch.bfloat16)  # object() cannot run
    with pytest.raises(ValueError, match="logits=True judges by SNR"):
        verify.check(object(), [torch.zeros(1)], torch.zeros(1), logits=True)
    with pytest.raises(ValueError, match="pass the module, or threshold="):
        verify.check(object(), [torch.zeros(1)], torch.zeros(1), dtype=torch.float16)


def logits_with_margin(margin: float) -> torch.Tensor:
    """One position of logits with unit standard deviation, whose top two are ``margin`` (in standard deviations) apart."""
    values = torch.randn(1000, generator=torch.Generator().manual_seed(3)).clamp(-2, 2)
    values = (values - values.mean()) / values.std(unbiased=False)
    values[0], values[1] = 4.0, 4.0 - margin
    return values[None]


@pytest.mark.parametrize("margin, allowed", [(0.05, True), (0.5, False)])
def test_top_one_may_differ_only_where_the_reference_has_a_near_tie(margin, allowed):
    expected = logits_with_margin(margin)
    actual = expected.clone()
    actual[0, 0], actual[0, 1] = expected[0, 1], expected[0, 0]  # the top two swapped: nothing else differs
    threshold = fidelity.Threshold(snr=0.0, psnr=0.0, tie=0.1)
    row = fidelity.compare([actual], [expected], threshold, logits=True).outputs[0]
    assert (row.top1.ties, row.top1.flips) == ((1, 0) if allowed else (0, 1))
    assert row.ok is allowed
    assert fidelity.tie_margins(expected)[0].item() == pytest.approx(margin, rel=0.05)


def test_report_names_what_fell_short():
    expected = torch.randn(2, 100, generator=torch.Generator().manual_seed(4))
    threshold = fidelity.runtime_threshold("fp16", width=64, depth=3)
    report = fidelity.compare([expected + 0.5], [expected], threshold, precision="fp16")
    text = str(report)
    assert not report.ok and "SNR" in text and f"< {threshold.snr:.1f} dB" in text and "NOT OK" in text
    assert "tolerance of fp16" in text
    with pytest.raises(AssertionError, match="not close enough to its reference"):
        report.raise_for_mismatch()


def test_quality_against_fp32_counts_the_same_top_ones_and_decides_nothing():
    fp32 = torch.randn(4, 50, generator=torch.Generator().manual_seed(5))
    worse = fp32.clone()
    worse[0] = -worse[0]  # one position's order turned over
    found = fidelity.quality(worse, fp32)
    assert (found.same, found.positions) == (3, 4) and found.snr < 10
    assert "top-1 the same at 3 of 4" in str(found) and not hasattr(found, "ok")


# ---------------------------------------------------------------- lowered decoders (tiny Llama)


SHAPES = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=16)
#: (dtype, scheme) of each export: the dtypes, and a scheme on fp16 (palettize4: k-means of our own, no coreai-opt to
#: load here).  Every scheme on fp32 is tests/test_quantized_schemes.py's, on its own exports.
PRECISIONS = {"fp32": (torch.float32, None), "fp16": (torch.float16, None), "fp16 + palettize4": (torch.float16, "palettize4")}


def tiny_llama(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from llm_helpers import tiny

    return tiny("llama", dtype)


@pytest.fixture(scope="module")
def tiny_reference() -> text_generation.Reference:
    return text_generation.check.reference(tiny_llama(), SHAPES)


class Exported:
    """The tiny Llama lowered at one precision: its .pte's logits over the verify tokens, and its eager model."""

    def __init__(self, precision: str, reference: text_generation.Reference, directory: Path) -> None:
        from coreai_partitioner import save_pte

        self.dtype, self.scheme = PRECISIONS[precision]
        model = tiny_llama(self.dtype)
        held: list = []
        pte = save_pte(text_generation.lower_decoder(model, SHAPES, quantize=self.scheme, quantized_reference=held), directory / "model.pte")
        self.eager_model = held[0] if held else model  # the quantized eager model, or the model at its dtype
        self.logits = text_generation.check.program_logits(pte, reference, SHAPES)
        verify.reset_state(pte)

    def judge(self, reference: text_generation.Reference, eager_model: torch.nn.Module) -> text_generation.DecoderReport:
        eager = text_generation.check.eager_logits(eager_model, reference, SHAPES)
        return text_generation.check.judge(self.logits, reference, eager=eager, dtype=self.dtype, quantize=self.scheme)


@pytest.fixture(scope="module", params=list(PRECISIONS))
def exported(request, tiny_reference, tmp_path_factory) -> Exported:
    return Exported(request.param, tiny_reference, tmp_path_factory.mktemp("fidelity"))


@pytest.mark.slow
def test_llm_check_passes_the_tiny_models_pte_and_fails_it_against_each_broken_twin(exported, tiny_reference):
    from llm_helpers import TWINS, broken_twin

    report = exported.judge(tiny_reference, exported.eager_model)
    assert report.ok, report
    for twin in TWINS:
        report = exported.judge(tiny_reference, broken_twin(exported.eager_model, twin))
        row = report.signal.outputs[0]
        assert not report.ok and row.snr < row.threshold.snr, (twin, str(report))


@pytest.mark.slow
def test_a_broken_twins_own_pte_fails_against_the_models_eager_logits(tiny_reference, tmp_path):
    """The other way round: the twin exported (every SiLU computed as ReLU), the model's eager logits the reference."""
    from llm_helpers import broken_twin

    from coreai_partitioner import save_pte

    pte = save_pte(text_generation.lower_decoder(broken_twin(tiny_llama(), "SiLU converted as ReLU"), SHAPES), tmp_path / "twin.pte")
    report = text_generation.check.check(pte, tiny_reference, SHAPES)
    assert not report.ok and "SNR" in str(report.signal), report
    assert "the eager model (fp32)" in str(report) and "a report, not a check" in str(report)
