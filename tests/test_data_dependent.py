"""Programs with data-dependent sizes through ``lower()`` (``partition/claims/data_dependent.py``, ``lowering/passes.py``).

A size known only when the program runs (boolean-mask indexing, ``nonzero``,
a size read with ``item()``) crashed the edge passes
(``PendingUnbackedSymbolNotFound``) or the converter on nodes claimed with it.
Such nodes stay outside on the portable kernels, what is computed before and
after them is claimed as usual, and the ``.pte`` gives eager's result.  A size
with no largest value is refused before lowering, naming the node and the two
fixes; ``max_data_dependent_size=`` is one (transformers' ``VitsModel``,
whose frame count its duration predictor decides).
"""

from __future__ import annotations

import pytest
import torch
from helpers import Op, run_pte
from requires import require

from coreai_partitioner import lower
from coreai_partitioner.verify.describe import outside_delegates

pytestmark = pytest.mark.slow


def _masked_sum(y):
    y = y * 2
    return y[y > 0].sum().reshape(1) + 1  # the converter: "aten_index_tensor[0]: rank 3 vs 1"


def _nonzero(x):
    y = x * 2 + 1
    # of a 1-d tensor: ExecuTorch plans nonzero's (count, ndim) result column-major, as torch makes it, and its portable
    # kernel writes it row-major, which read back transposes a result of more than one column (XNNPACK's flow too)
    return torch.nonzero(y.reshape(-1) > 1), (y * 3).sum(0)


def _arange_of_item(x, n):
    k = n.item()
    torch._check(k >= 0)
    torch._check(k <= 16)  # ExecuTorch plans memory for the largest size
    return torch.arange(k, dtype=torch.float32) * 2 + (x * 3).sum()  # the converter: "'SymInt' object has no attribute 'dtype'"


def _arange_of_unbounded_item(x, n):
    k = n.item()
    torch._check(k >= 0)
    return torch.arange(k, dtype=torch.float32) * 2 + (x * 3).sum()


def _masked_write(x):
    # transformers' VITS spline: the elements a mask picks written through it (index_put with a data-dependent count,
    # whose values' shape the claim compares with the indexed shape without a guard)
    inside = x.abs() <= 1
    out = torch.zeros_like(x)
    out[inside] = x[inside] * 2
    out[~inside] = x[~inside]
    return out


#: name -> (model, sample, the op left outside)
CASES = {
    "boolean-mask write": (Op(_masked_write), (torch.randn(2, 3, 4),), "aten.index_put.default"),
    "boolean-mask indexing": (Op(_masked_sum), (torch.randn(2, 3, 4),), "aten.index.Tensor"),
    "nonzero": (Op(_nonzero), (torch.randn(4, 5),), "aten.nonzero.default"),
    "arange sized by item()": (Op(_arange_of_item), (torch.randn(3), torch.tensor(5)), "aten.arange.start_step"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_data_dependent_size_stays_outside_and_the_pte_gives_eagers_result(case):
    model, sample, op = CASES[case]
    lowered = lower(model, sample)
    assert op in outside_delegates(lowered)["forward"]
    outputs = run_pte(lowered.to_executorch().buffer, sample)
    expected = model(*sample)
    for actual, wanted in zip(outputs, expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(actual, wanted, rtol=1e-5, atol=1e-5)


def test_a_size_with_no_largest_value_is_refused_before_lowering_naming_its_node_and_the_fixes():
    with pytest.raises(ValueError, match=r"made by node 'arange.*torch._check\(n <= N\), or pass max_data_dependent_size=N"):
        lower(Op(_arange_of_unbounded_item), (torch.randn(3), torch.tensor(5)))
    with pytest.raises(ValueError, match="max_data_dependent_size=0: give a positive int"):
        lower(Op(_arange_of_unbounded_item), (torch.randn(3), torch.tensor(5)), max_data_dependent_size=0)


def test_max_data_dependent_size_bounds_an_item_size_and_the_pte_gives_eagers_result():
    model, sample = Op(_arange_of_unbounded_item), (torch.randn(3), torch.tensor(5))
    outputs = run_pte(lower(model, sample, max_data_dependent_size=16).to_executorch().buffer, sample)
    torch.testing.assert_close(outputs[0], model(*sample), rtol=1e-5, atol=1e-5)


def _tiny_vits():
    from transformers import VitsConfig, VitsModel

    config = VitsConfig(
        vocab_size=12, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, window_size=2, ffn_dim=8,
        flow_size=4, spectrogram_bins=5, upsample_initial_channel=8, upsample_rates=[2], upsample_kernel_sizes=[4],
        resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1]], prior_encoder_num_flows=1,
        prior_encoder_num_wavenet_layers=1, posterior_encoder_num_wavenet_layers=1, duration_predictor_num_flows=1,
        duration_predictor_filter_channels=8, depth_separable_num_layers=1, duration_predictor_flow_bins=2,
        noise_scale=0.0, noise_scale_duration=0.0,  # the noise drawn inside is then multiplied by zero: one waveform
    )
    torch.manual_seed(0)
    return VitsModel(config).eval()


class _First(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, hidden):
        return self.module(hidden)[0]


class _Waveform(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).waveform


def test_vits_relative_position_attention_is_one_delegate_and_gives_eagers_output():
    """Its ``matmul`` with a batch-1 table decomposes to a ``bmm`` over a broadcast, which coreai-core's rewrite
    mis-ranked ('broadcast_in_dims' ... must have the same rank); ``lowering.passes.BatchOneBmmAsMm`` makes it one mm."""
    require("transformers", "hf")
    model, sample = _First(_tiny_vits().text_encoder.encoder.layers[0].attention), (torch.randn(1, 5, 8),)
    lowered = lower(model, sample)
    assert not outside_delegates(lowered)["forward"]
    torch.testing.assert_close(run_pte(lowered.to_executorch().buffer, sample)[0], model(*sample), rtol=1e-5, atol=1e-5)


def test_the_tiny_vits_model_through_lower_gives_eagers_waveform():
    """The frame count is ``predicted_lengths.max()``: data-dependent, bounded by ``max_data_dependent_size``."""
    require("transformers", "hf")
    model, sample = _Waveform(_tiny_vits()), (torch.tensor([[3, 7, 1, 9, 4]]),)
    with pytest.raises(ValueError, match="max_data_dependent_size=N"):
        lower(model, sample)
    lowered = lower(model, sample, max_data_dependent_size=256)
    (waveform,) = run_pte(lowered.to_executorch().buffer, sample)
    with torch.no_grad():
        expected = model(*sample)
    assert waveform.shape == expected.shape and expected.shape[1] > 0
    torch.testing.assert_close(waveform, expected, rtol=1e-4, atol=1e-5)
