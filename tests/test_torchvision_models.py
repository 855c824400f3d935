"""torchvision models whole in one Core AI delegate, through the suite's own coreai tester, against eager.

``benchmarks/vision_models.py`` runs every model of ExecuTorch's backend
suite side by side with XNNPACK (``benchmarks/results/vision_models.txt``);
CI runs the two small ones.  Random weights, as the suite builds them.
"""

from __future__ import annotations

import pytest
import torch

import backend_suite.torchvision_ops  # noqa: F401  (torchvision's operator schemas, before torchvision)
from requires import require

torchvision = require("torchvision", install="pip install --no-deps torchvision==0.28.0 (README's test command)")

from backend_suite.flows import CoreAITester  # noqa: E402
from coreai_partitioner.verify.describe import outside_delegates  # noqa: E402

pytestmark = pytest.mark.slow


def snr_db(expected: torch.Tensor, actual: torch.Tensor) -> float:
    noise = (expected.double() - actual.double()).pow(2).mean()
    return float(10 * torch.log10(expected.double().pow(2).mean() / noise))


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet18"])
def test_a_torchvision_model_is_one_delegate_with_nothing_outside_and_gives_eagers_output(name):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)().eval()
    sample = (torch.randn(1, 3, 96, 96),)
    tester = CoreAITester(model, sample)
    tester.export().to_edge_transform_and_lower()
    edge = tester.get_artifact()
    assert not outside_delegates(edge)["forward"], "nodes left outside the Core AI delegate"
    tester.to_executorch().serialize()
    from executorch.runtime import Runtime

    actual = Runtime.get().load_program(tester.get_artifact()).load_method("forward").execute(list(sample))[0]
    with torch.no_grad():
        assert snr_db(model(*sample), actual) > 80
