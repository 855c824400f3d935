"""What the partitioner claims per op and its arguments (``coreai_partitioner/partition/claims/``).

Each case is a pattern the converter lowers wrong or dies on: it must stay
outside the delegate (``CoreAIPartitioner.refused`` says why) and the
``.pte`` must give eager's result through ExecuTorch's runtime; beside it, an
ordinary use of the same op is claimed.
"""

from __future__ import annotations

import pytest
import torch
from helpers import Op, lower_plain, run_edge
from torch import nn

from coreai_partitioner.verify.describe import outside_delegates

pytestmark = pytest.mark.slow




pool = torch.randn(1, 2, 7, 7)
pool3d = torch.randn(1, 2, 5, 5, 5)
rows = torch.randn(5, 3)

#: name -> (model, sample, the op left outside, words of the reason)
REFUSED = {
    "avg_pool2d ceil_mode": (Op(lambda x: nn.functional.avg_pool2d(x, 2, ceil_mode=True)), (pool,), "avg_pool2d", "ceil_mode"),
    "avg_pool2d count_include_pad=False": (
        Op(lambda x: nn.functional.avg_pool2d(x, 3, 1, padding=1, count_include_pad=False)), (pool,), "avg_pool2d", "count_include_pad"),
    "avg_pool1d ceil_mode": (Op(lambda x: nn.functional.avg_pool1d(x, 2, ceil_mode=True)), (rows[None],), "avg_pool2d", "ceil_mode"),
    "max_pool2d read indices": (
        Op(lambda x: nn.functional.max_pool2d(x, 2, return_indices=True)[1].float()), (pool,), "max_pool2d_with_indices", "indices"),
    "amax every dim": (Op(lambda x: torch.amax(x, dim=(), keepdim=True)), (rows,), "amax", "dim=[]"),
    "mean dim=None": (Op(lambda x: torch.mean(x, dim=None, keepdim=True)), (rows,), "mean", "dim=None"),
    "sum to rank 0": (Op(lambda x: x.sum()), (rows,), "sum", "rank-0"),
    "squeeze a dim of size 3": (Op(lambda x: x.squeeze(1)), (rows,), "squeeze", "sizes [3]"),
    "add alpha": (Op(lambda x, y: torch.add(x, y, alpha=2.0)), (rows, rows + 1), "add", "alpha"),
    "index_put accumulate": (
        Op(lambda x, v: x.index_put((torch.tensor([0, 0, 2]),), v, accumulate=True)), (rows, torch.randn(3, 3)), "index_put", "accumulate"),
    "mul of bools": (Op(lambda x, y: ((x > 0) * (y > 0)).float() + x), (rows, rows - 0.5), "mul", "bool kernel"),
    "index_put broadcast": (
        Op(lambda x, v: x.index_put((torch.tensor([1, 3]),), v)), (rows, torch.randn(3)), "index_put", "broadcast"),
}

#: the same ops with arguments the converter lowers right: claimed
CLAIMED = {
    "avg_pool2d": (Op(lambda x: nn.functional.avg_pool2d(x, 3, 2, padding=1)), (pool,)),
    "max_pool2d": (nn.MaxPool2d(3, 2, padding=1), (pool,)),
    "amax over a dim": (Op(lambda x: torch.amax(x, dim=1)), (rows,)),
    "squeeze a dim of size 1": (Op(lambda x: x.unsqueeze(1).squeeze(1) * 2), (rows,)),
    "index_put rows": (Op(lambda x, v: x.index_put((torch.tensor([1, 3]),), v)), (rows, torch.randn(2, 3))),
    "conv_transpose2d": (nn.ConvTranspose2d(2, 2, 2), (pool,)),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_node_the_converter_cannot_lower_right_stays_outside_and_the_pte_gives_eagers_result(case):
    model, sample, op, words = REFUSED[case]
    torch.manual_seed(0)
    edge, partitioner = lower_plain(model, sample)
    outside = outside_delegates(edge)["forward"]
    assert any(op in name for name in outside), f"{op} was claimed: outside are {dict(outside)}"
    assert any(op in name and words in reason for name, reasons in partitioner.refused.items() for reason in reasons), partitioner.refused
    torch.testing.assert_close(run_edge(edge, sample), model(*sample), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", sorted(CLAIMED))
def test_an_ordinary_use_of_the_same_op_is_claimed_whole_and_right(case):
    model, sample = CLAIMED[case]
    torch.manual_seed(0)
    edge, partitioner = lower_plain(model, sample)
    assert not outside_delegates(edge)["forward"], partitioner.refused
    torch.testing.assert_close(run_edge(edge, sample), model(*sample), rtol=1e-4, atol=1e-5)


def test_a_transposed_3d_convolution_stays_outside_rather_than_kill_the_lowering():
    # ExecuTorch's portable kernels have no 3-d convolution either, so the .pte cannot run here (the suite skips it)
    edge, partitioner = lower_plain(nn.ConvTranspose3d(2, 2, 2), (pool3d,))
    assert sum(outside_delegates(edge)["forward"].values()) == 1
    assert any("Transposed conv3d" in reason for reason in partitioner.refused["aten.convolution.default"])


def test_a_batchnorms_unread_counter_and_an_int64_constant_leave_no_cast_outside_the_delegate():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.BatchNorm2d(2)

        def forward(self, x):
            return self.norm(x) * 3  # 3 becomes an int64 lifted constant; norm has num_batches_tracked (int64)

    model, sample = Scaled().eval(), (pool,)
    edge, _ = lower_plain(model, sample)
    assert not outside_delegates(edge)["forward"]


def _dim(name: str, multiple: int = 1):
    return torch.export.Dim(name, min=2, max=16) * multiple if multiple > 1 else torch.export.Dim(name, min=2, max=32)


#: name -> (model, sample, dynamic shapes, the op left outside, words of the reason), at symbolic sizes
REFUSED_SYMBOLIC = {
    "index_put with a symbolic size past dim 0": (
        Op(lambda x, v: x.index_put((torch.tensor([1, 3]),), v) * 2), (torch.randn(4, 6), torch.randn(2, 6)),
        ({1: _dim("n")}, {1: _dim("n")}), "index_put", "dynamic batch dimension"),
    "max_pool2d ceil_mode at a symbolic size": (
        nn.MaxPool2d(3, 2, ceil_mode=True), (torch.randn(1, 2, 8, 8),), ({2: _dim("h", 2)},), "max_pool2d", "ceil_mode=True at a symbolic"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_SYMBOLIC))
def test_a_rule_judges_a_node_at_a_symbolic_size_as_it_judges_any_other(case):
    model, sample, dynamic, op, words = REFUSED_SYMBOLIC[case]
    edge, partitioner = lower_plain(model, sample, dynamic_shapes=(dynamic,) if isinstance(model, Op) else dynamic)
    outside = outside_delegates(edge)["forward"]
    assert any(op in name for name in outside), f"{op} was claimed: outside are {dict(outside)}"
    assert any(op in name and words in reason for name, reasons in partitioner.refused.items() for reason in reasons), partitioner.refused
    torch.testing.assert_close(run_edge(edge, sample), model(*sample), rtol=1e-5, atol=1e-5)


def test_a_pool_at_a_symbolic_size_is_claimed_where_no_argument_needs_the_static_size():
    # XNNPACK refuses ceil_mode only under dynamic shapes; by floor, PyTorch's output size is the converter's
    model = Op(lambda x: nn.functional.avg_pool2d(x, 2) + nn.functional.max_pool2d(x, 2))
    sample = (torch.randn(1, 2, 8, 8),)
    edge, partitioner = lower_plain(model, sample, dynamic_shapes=(({2: _dim("h", 2), 3: _dim("w", 2)},),))
    outside = outside_delegates(edge)["forward"]
    assert not any("pool" in name for name in outside), (dict(outside), partitioner.refused)
    torch.testing.assert_close(run_edge(edge, sample), model(*sample), rtol=1e-5, atol=1e-5)


def test_refused_keeps_every_reason_an_op_was_refused_for():
    model = Op(lambda x, y, s: torch.add(x, y, alpha=2.0) * torch.add(x, s))
    sample = (rows, rows + 1, torch.tensor(2.0))
    edge, partitioner = lower_plain(model, sample)
    reasons = partitioner.refused["aten.add.Tensor"]
    assert any("alpha" in reason for reason in reasons) and any("rank-0 delegate input" in reason for reason in reasons), reasons
    torch.testing.assert_close(run_edge(edge, sample), model(*sample), rtol=1e-5, atol=1e-5)
