"""torchvision models whole in one Core AI delegate, through the suite's own coreai tester, against eager.

``benchmarks/vision_models.py`` runs every model of ExecuTorch's backend
suite side by side with XNNPACK (``benchmarks/results/vision_models.txt``);
CI runs the models issue #44 names at small images, each in a process of its own
(:mod:`backend_suite.models`: torchvision stays off this process's path).
Random weights, as the suite builds them.
"""

from __future__ import annotations

import os

import pytest

from backend_suite import INSTALL_TORCHVISION, TORCHVISION, models
from llm_helpers import ci_sample

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _torchvision_installed():
    if not (TORCHVISION / "torchvision").is_dir():
        message = f"torchvision is not in {TORCHVISION}: {INSTALL_TORCHVISION}"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI is set, so a missing dependency fails rather than skips", pytrace=False)
        pytest.skip(message)


#: the models issue #44 names (mobilenet_v2: BatchNorm's counters; resnet50: max_pool; vit_b_16: attention, its head
#: drawn) at small images, and a shifted Swin V2 block (its rank-0 constant)
MODELS = [("mobilenet_v2", 64), ("resnet50", 32), ("vit_b_16", 32), ("swin_v2_block", 8)]
#: CI's sample; resnet50 (its max_pool's rules are test_claims_pooling's) in the benchmark tier.
IN_CI = [("mobilenet_v2", 64), ("vit_b_16", 32), ("swin_v2_block", 8)]


@pytest.mark.parametrize("name, size", ci_sample(MODELS, IN_CI, several_names=True))
def test_a_torchvision_model_is_one_delegate_with_nothing_outside_and_gives_eagers_output(name, size):
    result = models.run(name, size=size)
    assert result["outside"] == {}, f"nodes left outside the Core AI delegate: {result['outside']}"
    assert result["delegates"] == 1
    assert result["snr_db"] > 80
