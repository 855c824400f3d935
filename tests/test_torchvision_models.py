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


def test_a_shifted_swin_v2_block_is_one_delegate_and_gives_eagers_output():
    # its rank-0 constants (the 16 of 16 * sigmoid(bias)) are taken over with the delegate, never a rank-0 input
    # (claims/scalars.py; tests/test_rank0_operands.py has the pattern that traps the runtime)
    from executorch.runtime import Runtime

    from coreai_partitioner import load_runtime_backend, lower

    torch.manual_seed(0)
    block = torchvision.models.swin_transformer.SwinTransformerBlockV2(32, 2, window_size=[4, 4], shift_size=[2, 2]).eval()
    sample = (torch.randn(1, 8, 8, 32),)
    lowered = lower(block, sample)
    assert not outside_delegates(lowered)["forward"], "nodes left outside the Core AI delegate"
    load_runtime_backend()
    actual = Runtime.get().load_program(lowered.to_executorch().buffer).load_method("forward").execute(list(sample))[0]
    with torch.no_grad():
        assert snr_db(block(*sample), actual) > 80
