"""Low-precision verify: SNR and PSNR as coremltools and ExecuTorch compute them, the thresholds, near-ties."""

from __future__ import annotations

import math

import pytest
import torch

from coreai_partitioner import llm, quantize, verify
from coreai_partitioner.verify import fidelity


def test_snr_and_psnr_are_coremltools_compute_snr_and_psnr():
    from coremltools.converters.mil.testing_utils import compute_snr_and_psnr

    generator = torch.Generator().manual_seed(0)
    expected = torch.randn(4, 300, generator=generator, dtype=torch.float64)
    actual = expected + 0.05 * torch.randn(4, 300, generator=generator, dtype=torch.float64)
    snr, psnr = fidelity.snr_psnr(actual, expected)
    theirs = compute_snr_and_psnr(actual.flatten().numpy(), expected.flatten().numpy())
    assert snr == pytest.approx(theirs[0], abs=1e-9) and psnr == pytest.approx(theirs[1], abs=1e-9)


def test_snr_is_executorch_inspectors_numeric_gap():
    from executorch.devtools.inspector.numerical_comparator.snr_numerical_comparator import SNRComparator

    generator = torch.Generator().manual_seed(1)
    expected = torch.randn(2, 64, generator=generator) * 3
    actual = expected + 0.1 * torch.randn(2, 64, generator=generator)
    assert fidelity.snr_psnr(actual, expected)[0] == pytest.approx(SNRComparator().element_compare(expected, actual), abs=1e-3)


def test_a_shift_of_a_positions_logits_is_no_noise_once_centered():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(2))
    shifted = logits + torch.tensor([[5.0], [-2.0], [0.5]])
    threshold = fidelity.threshold_for("fp16")
    assert fidelity.compare([shifted], [logits], threshold).outputs[0].snr < 10  # raw: the shift is noise
    judged = fidelity.compare([shifted], [logits], threshold, logits=True).outputs[0]
    assert judged.snr > 90 and judged.ok  # float32 rounding of the shift only


def test_a_scheme_adds_its_noise_to_its_dtypes():
    fp16, int4 = fidelity.DTYPE_THRESHOLDS["fp16"], fidelity.SCHEME_THRESHOLDS["int4"]
    both = fidelity.threshold_for(torch.float16, "int4")
    assert both.snr == pytest.approx(-10 * math.log10(10 ** (-fp16.snr / 10) + 10 ** (-int4.snr / 10)))
    assert both.snr < min(fp16.snr, int4.snr) and both.tie == pytest.approx(math.hypot(fp16.tie, int4.tie))
    assert fidelity.threshold_for(torch.float32) == fidelity.DTYPE_THRESHOLDS["fp32"]


def test_every_quantization_scheme_has_a_threshold():
    assert set(quantize.SCHEMES) <= set(fidelity.SCHEME_THRESHOLDS)


def test_an_unknown_scheme_or_dtype_names_the_known_ones_and_the_fix():
    with pytest.raises(fidelity.UnknownPrecision) as error:
        fidelity.threshold_for(torch.float32, "int3")
    message = str(error.value)
    assert "'int3'" in message and "int8, int4" in message and "SCHEME_THRESHOLDS" in message and "threshold=" in message
    with pytest.raises(fidelity.UnknownPrecision, match="dtype 'bf16'.*fp32, fp16"):
        fidelity.threshold_for(torch.bfloat16)


def test_verify_check_refuses_an_unknown_scheme_before_running_anything():
    with pytest.raises(fidelity.UnknownPrecision):
        verify.check(object(), [torch.zeros(1)], torch.zeros(1), quantize="int3")  # object() cannot run
    with pytest.raises(ValueError, match="logits=True judges by SNR"):
        verify.check(object(), [torch.zeros(1)], torch.zeros(1), logits=True)


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
    report = fidelity.compare([expected + 0.5], [expected], fidelity.threshold_for("fp16"), precision="fp16")
    text = str(report)
    assert not report.ok and "SNR" in text and "< 25.0 dB" in text and "NOT OK" in text and "thresholds of fp16" in text
    with pytest.raises(AssertionError, match="not close enough to its fp32 reference"):
        report.raise_for_mismatch()


# ---------------------------------------------------------------- lowered decoders (tiny Llama)


SHAPES = llm.DecoderShapes(max_context_len=32, prefill_chunk=16)
#: (dtype, quantization scheme) of each precision a wrong tiny model is exported at.  At int4 the threshold admits
#: a program as far from its fp32 model as the real SmolLM2's int4 export is (about 5 dB), which the tiny
#: models' wrong variants are not far enough for; tests/test_real_model.py judges int4 on the real model.
PRECISIONS = {"fp32": (torch.float32, None), "fp16": (torch.float16, None), "int8": (torch.float32, "int8")}


def tiny_llama() -> torch.nn.Module:
    from llm_helpers import tiny

    return tiny("llama")


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """The last layer's down_proj with noise of three times its own spread added (seeded)."""
    weight = model.model.layers[-1].mlp.down_proj.weight
    with torch.no_grad():
        weight.add_(3 * weight.std() * torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
    return model


def swapped(model: torch.nn.Module) -> torch.nn.Module:
    """The two layers in each other's place."""
    first, second = model.model.layers[0], model.model.layers[1]
    model.model.layers[0], model.model.layers[1] = second, first
    return model


MODELS = {"right": lambda model: model, "perturbed weight": perturbed, "two layers swapped": swapped}


@pytest.fixture(scope="module")
def tiny_reference() -> llm.Reference:
    return llm.check.reference(tiny_llama(), SHAPES)


def exported_at(make, precision: str, path) -> None:
    """``make`` applied to the tiny Llama, lowered at ``precision`` and written to ``path``."""
    dtype, scheme = PRECISIONS[precision]
    model = make(tiny_llama()).to(dtype)
    path.write_bytes(llm.lower_decoder(model, SHAPES, quantize=scheme).to_executorch().buffer)


@pytest.mark.slow
@pytest.mark.parametrize("precision", sorted(PRECISIONS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_wrong_model_fails_where_the_right_one_passes(model, precision, tiny_reference, tmp_path):
    path = tmp_path / "model.pte"
    exported_at(MODELS[model], precision, path)
    dtype, scheme = PRECISIONS[precision]
    report = llm.check.check(path, tiny_reference, SHAPES, dtype=dtype, quantize=scheme)
    row = report.signal.outputs[0]
    if model == "right":
        assert report.ok, report
    else:
        assert not report.ok and row.snr < row.threshold.snr, report
