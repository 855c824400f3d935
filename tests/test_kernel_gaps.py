"""What neither the converter nor ExecuTorch's portable kernels run, through ``lower()`` (``partition/kernel_gaps.py``).

``median`` and ``adaptive_max_pool`` have no Core AI lowering and no portable
kernel; ``round(decimals=)`` is outside the Core ATen opset ExecuTorch's IR
check allows.  Each lowers through :func:`coreai_partitioner.lower` and the
``.pte`` gives eager's result in ExecuTorch's runtime.
"""

from __future__ import annotations

import pytest
import torch
from helpers import Op, run_pte
from torch import nn

from coreai_partitioner import lower

pytestmark = pytest.mark.slow

#: name -> (model, sample)
GAPS = {
    "adaptive_max_pool2d to a divisor": (Op(lambda x: nn.functional.adaptive_max_pool2d(x, (2, 3))), (torch.randn(1, 2, 6, 6),)),
    "adaptive_max_pool2d, uneven windows and indices": (
        Op(lambda x: nn.functional.adaptive_max_pool2d(x, (3, 2), return_indices=True)), (torch.randn(1, 2, 7, 5),)),
    "adaptive_max_pool1d": (Op(lambda x: nn.functional.adaptive_max_pool1d(x, 3)), (torch.randn(2, 3, 8),)),
    "adaptive_max_pool3d with indices": (
        Op(lambda x: nn.functional.adaptive_max_pool3d(x, 2, return_indices=True)), (torch.randn(1, 2, 5, 4, 3),)),
    "median": (Op(lambda x: torch.median(x).reshape(1)), (torch.randn(4, 5),)),
    "median over a dim, with indices": (Op(lambda x: torch.median(x, dim=1)), (torch.randn(4, 5),)),
    "median keepdim": (Op(lambda x: torch.median(x, dim=0, keepdim=True).values * 2), (torch.randn(6, 3),)),
    "round to 2 decimals": (Op(lambda x: torch.round(x * 10, decimals=2)), (torch.randn(4, 5),)),
    "round to -1 decimals": (Op(lambda x: torch.round(x * 100, decimals=-1)), (torch.randn(4, 5),)),
}


@pytest.mark.parametrize("case", sorted(GAPS))
def test_an_op_neither_the_converter_nor_the_portable_kernels_run_lowers_and_gives_eagers_result(case):
    model, sample = GAPS[case]
    outputs = run_pte(lower(model, sample).to_executorch().buffer, sample)
    expected = model(*sample)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    assert len(outputs) == len(expected)
    for actual, wanted in zip(outputs, expected):
        torch.testing.assert_close(actual, wanted, rtol=0, atol=0)


def test_the_documented_call_lowers_them_too():
    from executorch.exir import to_edge_transform_and_lower

    from coreai_partitioner import CoreAIPartitioner, get_default_compile_config, get_default_passes

    model = Op(lambda x: torch.round(nn.functional.adaptive_max_pool2d(x, 2), decimals=1) + torch.median(x, dim=-1).values.mean())
    sample = (torch.randn(1, 2, 4, 4),)
    lowered = to_edge_transform_and_lower(
        torch.export.export(model, sample),
        partitioner=[CoreAIPartitioner()],
        compile_config=get_default_compile_config(),
        transform_passes=get_default_passes(),
    )
    torch.testing.assert_close(run_pte(lowered.to_executorch().buffer, sample)[0], model(*sample), rtol=1e-6, atol=1e-6)
