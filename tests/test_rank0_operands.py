"""A rank-0 tensor never enters a Core AI delegate as an input (``claims/scalars.py``).

coreai-core 1.0.0b3's runtime traps (SIGILL) executing a delegate with a
rank-0 input: without the rule, each refused case here kills the test process
on ``execute``.  A rank-0 constant the delegate takes over with its data is no
input, and stays inside.
"""

from __future__ import annotations

import pytest
import torch
from helpers import lower_plain, run_edge
from torch import nn

from coreai_partitioner.verify.describe import outside_delegates

pytestmark = pytest.mark.slow


class ScaledByInput(nn.Module):
    def forward(self, x, scale):
        return torch.relu(x) * scale


class ScaledByBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor(16.0))

    def forward(self, x):
        return torch.relu(x) * self.scale * torch.tensor(2)


def _lower_and_run(model: nn.Module, sample: tuple):
    edge, partitioner = lower_plain(model, sample)
    return outside_delegates(edge)["forward"], partitioner.refused, run_edge(edge, sample)


x = torch.randn(2, 8, 8)


@pytest.mark.parametrize(
    "model, sample",
    [
        (ScaledByInput(), (x, torch.tensor(3.0))),
        (ScaledByInput(), (x, torch.tensor(3))),  # int64: its int32 cast is rank 0 too
    ],
    ids=["float input", "int64 input"],
)
def test_a_rank0_operand_from_outside_keeps_its_reader_outside_and_the_pte_gives_eagers_result(model, sample):
    outside, refused, actual = _lower_and_run(model, sample)
    assert outside["aten.mul.Tensor"] == 1
    assert any("rank-0 delegate input" in reason for reason in refused["aten.mul.Tensor"])
    assert "aten.relu.default" not in outside
    torch.testing.assert_close(actual, model(*sample))


def test_a_rank0_constant_stays_inside_the_delegate():
    model = ScaledByBuffer()
    outside, refused, actual = _lower_and_run(model, (x,))
    assert not outside
    torch.testing.assert_close(actual, model(x))
