"""``get_default_passes`` drops an ``as_strided_copy`` that restrides a tensor to its own layout (``RemoveNoopAsStrided``).

``adaptive_avg_pool2d(x, 1)`` of a permuted tensor (the heads of convnext and
swin) decomposes with a restride of the pooled ``(N, C, 1, 1)`` to
channels-last strides; the converter has no ``as_strided``, so kept it would be
a node outside cutting the model in two delegates.
"""

from __future__ import annotations

import pytest
import torch
from helpers import run_edge

from coreai_partitioner import CoreAIPartitioner, get_default_passes
from coreai_partitioner.verify.describe import outside_delegates

pytestmark = pytest.mark.slow


class PooledHead(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1).flatten(1)


def test_a_global_average_pool_of_a_permuted_tensor_is_one_delegate_and_gives_eagers_result():
    from executorch.exir import to_edge_transform_and_lower

    sample = (torch.randn(1, 7, 7, 16),)
    edge = to_edge_transform_and_lower(
        torch.export.export(PooledHead(), sample), partitioner=[CoreAIPartitioner()], transform_passes=get_default_passes()
    )
    assert not outside_delegates(edge)["forward"], "nodes left outside the Core AI delegate"
    actual = run_edge(edge, sample)
    torch.testing.assert_close(actual, PooledHead()(*sample))
