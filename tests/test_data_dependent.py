"""Programs with data-dependent sizes through ``lower()`` (``partition/claims/data_dependent.py``, ``lowering/passes.py``).

A size known only when the program runs (boolean-mask indexing, ``nonzero``,
a size read with ``item()``) crashed the edge passes
(``PendingUnbackedSymbolNotFound``) or the converter on nodes claimed with it.
Such nodes stay outside on the portable kernels, what is computed before and
after them is claimed as usual, and the ``.pte`` gives eager's result.
"""

from __future__ import annotations

import pytest
import torch
from helpers import Op, run_pte

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


#: name -> (model, sample, the op left outside)
CASES = {
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
