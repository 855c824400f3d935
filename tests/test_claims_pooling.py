"""What the partitioner claims of pooling, convolution and upsampling (``claims/pooling.py``, ``convolution.py``,
``upsampling.py``), and the pool arguments written out before coreai-torch reads them
(``backends/apple_coreai/passes.py``'s ``pool_arguments_in_full``).

Each refused case is a pattern the converter lowers wrong: it stays outside
the delegate with its reason, and the ``.pte`` gives eager's result through
ExecuTorch's runtime.  Each claimed case is the same op with arguments the
converter lowers right (among them those it died on before their arguments
were written out): one delegate, nothing outside, eager's result.
``tests/test_claims.py`` holds the first case of each rule.
"""

from __future__ import annotations

import pytest
import torch
from helpers import Op, lower_plain, run_edge
from torch import nn
from torch.nn import functional as F

from coreai_partitioner.backends.apple_coreai.passes import pool_arguments_in_full
from coreai_partitioner.verify.describe import outside_delegates




torch.manual_seed(0)
odd = torch.randn(1, 2, 7, 7)
even = torch.randn(1, 2, 6, 6)
five = torch.randn(1, 2, 5, 5)
volume = torch.randn(1, 2, 5, 6, 7)
rows = torch.randn(1, 4, 9)

#: name -> (model, sample, the op left outside, words of the reason)
REFUSED = {
    "avg_pool2d ceil_mode adds a window": (
        Op(lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True)), (even,), "avg_pool2d", "ceil_mode=True makes the output [3, 3]"),
    "avg_pool1d count_include_pad=False with padding": (
        Op(lambda x: F.avg_pool1d(x, 3, 2, padding=1, count_include_pad=False)), (rows,), "avg_pool2d", "count_include_pad"),
    "max_pool2d ceil_mode window starting in the padding": (
        nn.MaxPool2d(2, 2, padding=1, ceil_mode=True), (five,), "max_pool2d_with_indices", "the converter sizes it [4, 4]"),
    "upsample_nearest2d 7 to 10 pixels": (
        nn.Upsample(size=(10, 14), mode="nearest"), (odd,), "upsample_nearest2d", "whole multiple"),
    "upsample_nearest2d scale_factor 1.5": (
        nn.Upsample(scale_factor=1.5, mode="nearest"), (odd,), "upsample_nearest2d", "whole scale factor"),
}

#: the same ops with arguments the converter lowers right: claimed whole
CLAIMED = {
    "avg_pool2d ceil_mode keeping the size, stride omitted": (Op(lambda x: F.avg_pool2d(x, 2, ceil_mode=True)), (even,)),
    "avg_pool2d count_include_pad=False without padding, stride omitted": (
        Op(lambda x: F.avg_pool2d(x, 2, count_include_pad=False)), (odd,)),
    "avg_pool2d divisor_override with count_include_pad=False": (
        Op(lambda x: F.avg_pool2d(x, 3, 2, padding=1, count_include_pad=False, divisor_override=5)), (odd,)),
    "avg_pool1d padded": (Op(lambda x: F.avg_pool1d(x, 3, 2, padding=1)), (rows,)),
    "avg_pool3d padded": (Op(lambda x: F.avg_pool3d(x, 3, 2, padding=1)), (volume,)),
    "adaptive_avg_pool2d": (nn.AdaptiveAvgPool2d((3, 2)), (odd,)),
    "max_pool2d padded, stride omitted": (Op(lambda x: F.max_pool2d(x, 3, padding=1)), (odd,)),
    "max_pool2d ceil_mode window starting inside": (nn.MaxPool2d(3, 2, padding=1, ceil_mode=True), (odd,)),
    "max_pool2d dilation": (nn.MaxPool2d((2, 3), (2, 1), padding=(1, 0), dilation=2), (odd,)),
    "max_pool2d indices unread": (Op(lambda x: F.max_pool2d(x, 2, return_indices=True)[0]), (odd,)),
    "max_pool1d ceil_mode": (nn.MaxPool1d(2, ceil_mode=True), (rows,)),
    "conv1d groups and dilation": (nn.Conv1d(4, 4, 3, padding=2, dilation=2, groups=2), (rows,)),
    "conv2d reflect padding": (nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"), (odd,)),
    "conv3d strided": (nn.Conv3d(2, 2, 3, stride=2, padding=1), (volume,)),
    "conv_transpose1d output_padding": (nn.ConvTranspose1d(4, 2, 3, stride=2, padding=1, output_padding=1), (rows,)),
    "conv_transpose2d groups, dilation and output_padding": (
        nn.ConvTranspose2d(2, 4, 3, stride=2, padding=1, output_padding=1, dilation=2, groups=2), (odd,)),
    "upsample_nearest2d 7 to 14 pixels": (nn.Upsample(size=(14, 21), mode="nearest"), (odd,)),
    "upsample_nearest2d scale_factor 2": (nn.Upsample(scale_factor=2, mode="nearest"), (odd,)),
    "upsample_bilinear2d align_corners": (nn.Upsample(size=(10, 12), mode="bilinear", align_corners=True), (odd,)),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_pool_or_upsample_the_converter_gets_wrong_stays_outside_and_the_pte_gives_eagers_result(case):
    model, sample, op, words = REFUSED[case]
    edge, partitioner = lower_plain(model, sample)
    outside = outside_delegates(edge)["forward"]
    assert any(op in name for name in outside), f"{op} was claimed: outside are {dict(outside)}"
    assert any(op in name and words in reason for name, reasons in partitioner.refused.items() for reason in reasons), partitioner.refused
    torch.testing.assert_close(run_edge(edge, sample), model(*sample), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CLAIMED))
def test_a_pool_conv_or_upsample_the_converter_lowers_right_is_claimed_whole_and_right(case):
    model, sample = CLAIMED[case]
    torch.manual_seed(0)
    model = model.eval()
    edge, partitioner = lower_plain(model, sample)
    assert not outside_delegates(edge)["forward"], partitioner.refused
    torch.testing.assert_close(run_edge(edge, sample), model(*sample), rtol=1e-4, atol=1e-5)


def _pool_node(fn, sample):
    graph = torch.export.export(Op(fn), sample).run_decompositions({}).graph_module
    (node,) = [node for node in graph.graph.nodes if "pool" in str(node.target)]
    return graph, node


def test_an_omitted_pool_stride_is_written_out_as_the_kernel_size_and_ceil_mode_gets_count_include_pad():
    graph, node = _pool_node(lambda x: F.avg_pool2d(x, 2, ceil_mode=True), (even,))
    assert node.args[1:] == ([2, 2], [], [0, 0], True)  # what torch.export gives coreai-torch: it dies on both
    assert pool_arguments_in_full(graph) == 1
    assert node.args[1:] == ([2, 2], [2, 2], [0, 0], True, True)
    assert pool_arguments_in_full(graph) == 0


def test_a_max_pool_is_written_out_with_its_dilation_and_ceil_mode():
    graph, node = _pool_node(lambda x: F.max_pool2d(x, 3, padding=1, return_indices=True)[0], (odd,))
    pool_arguments_in_full(graph)
    assert node.args[1:] == ([3, 3], [3, 3], [1, 1], [1, 1], False)
