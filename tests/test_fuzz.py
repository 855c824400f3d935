"""Property: any small transformer-like model lowers, and its .pte matches eager in ExecuTorch's runtime.

CI runs a small derandomized budget; ``benchmarks/fuzz.py --examples 200`` runs
long (200 examples, 0 failures when last run).  A failure found there is added
here as a named test of its own.
"""

from __future__ import annotations

from fuzz_models import Config, build, configs, sample, specs
import pytest
from hypothesis import HealthCheck, given, settings

from coreai_partitioner.verify.testing import assert_lowers_and_matches

pytestmark = pytest.mark.slow


def check(config: Config) -> None:
    assert_lowers_and_matches(build(config), sample(config), specs=specs(config))


@pytest.mark.filterwarnings("ignore:externalize_modules. none of")  # configs without any composite
@settings(
    max_examples=8,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(configs())
def test_random_models_lower_and_match_eager(config):
    check(config)
