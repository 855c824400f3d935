"""ExecuTorch's own Core AI tests, run against our partitioner and backend (tests/upstream/shim.py).

The shim runs the installed wheel's ``executorch/backends/apple/coreai/test``
modules (started by tests/conftest.py when collection ends, beside our tests) with ``unittest`` in a process of its own (under pytest,
``executorch/backends/apple`` would land on ``sys.path`` and ``import coreai``
would find the wrong package), with upstream's ``CoreAIPartitioner`` and
``CoreAIBackend`` bound to ours.  Their assertions are not touched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from requires import require

require("coreai_opt", "quantize")  # upstream's quantizer tests need it (the quantize extra)

pytestmark = pytest.mark.slow

UPSTREAM_TESTS = 93  # executorch 1.5.1

#: Tests that need macOS (``xcrun coreai-build``, the Metal toolchain); upstream skips them elsewhere.
MACOS_ONLY = {
    "test_preprocess.CoreAIAOTCompileTest.test_aot_inline_embeds_aimodelc": "compiles .aimodelc with xcrun coreai-build",
    "test_preprocess.CoreAIAOTCompileTest.test_aot_sidecar_writes_aimodelc_and_keeps_pte_small": "compiles .aimodelc with xcrun coreai-build",
    "test_preprocess.CoreAIAOTCompileTest.test_delegates_present": "compiles .aimodelc with xcrun coreai-build",
}


#: Upstream tests whose expectation this package does not meet on purpose, and why; each must fail (a pass is news).
DIVERGES = {
    "test_io_compat.BoundaryLoweringTest.test_rank0_output": (
        "it expects (x + x).sum() delegated whole, its rank-0 result the delegate's output; coreai-core returns a "
        "rank-0 output as rank 1, which no runtime can resize into the program's rank-0 output, so "
        "claims/scalar_results.py leaves the sum outside (test_claims_ops.py)"
    ),
    # Their model is x.sum() + y.sum(): a rank-0 result, left outside for the same reason, so nothing is delegated
    # and no shape config reaches the SDK.
    "test_shape_config.BoundaryCoverageTest.test_every_boundary_input_is_named": "a rank-0 program output (see above)",
    "test_shape_config.BoundaryCoverageTest.test_unenumerated_sibling_input_is_rejected": "a rank-0 program output (see above)",
}


SHIM = Path(__file__).parent / "upstream" / "shim.py"
sys.path.insert(0, str(SHIM.parent))
from shim import QUANTIZER_ONLY  # noqa: E402  (upstream's quantizer alone: skipped in CI's run, --all runs them)


def expected(name: str, on_macos: str) -> str:
    if name in MACOS_ONLY:
        return on_macos
    if name in QUANTIZER_ONLY:
        return "skipped"
    return "failed" if name in DIVERGES else "passed"


def test_upstream_coreai_tests_pass_against_our_partitioner_and_backend(upstream_run):
    log = upstream_run.wait(timeout=1800)  # started when collection ended (tests/conftest.py)
    results = upstream_run.results
    assert results.exists(), f"the upstream suite did not finish:\n{log}"
    tests = json.loads(results.read_text())["tests"]
    short = {test_id.removeprefix("executorch.backends.apple.coreai.test."): outcome for test_id, outcome in tests.items()}
    assert len(short) == UPSTREAM_TESTS, f"expected {UPSTREAM_TESTS} upstream tests, ran {len(short)}"

    expected_outcome = "passed" if sys.platform == "darwin" else "skipped"
    wrong = {
        name: f"{result['outcome']} (expected {expected(name, expected_outcome)})\n{result['detail'][-1500:]}"
        for name, result in short.items()
        if result["outcome"] != expected(name, expected_outcome)
    }
    assert not wrong, "upstream Core AI tests that do not pass against ours:\n\n" + "\n\n".join(
        f"{name}: {why}" for name, why in sorted(wrong.items())
    )


@pytest.mark.benchmark
def test_upstreams_quantizer_only_tests_pass_too(tmp_path):
    """The tests CI's run leaves out (``shim.QUANTIZER_ONLY``): upstream's quantizer against coreai-opt's finalize."""
    results = tmp_path / "upstream.json"
    done = subprocess.run(
        [sys.executable, str(SHIM), "--all", "--json", str(results), "-k", "CoreAIQuantizerConvBNTest"],
        capture_output=True, text=True, timeout=1200,
    )
    tests = json.loads(results.read_text())["tests"]
    assert {name.rsplit("test.", 1)[-1] for name in tests} == set(QUANTIZER_ONLY), done.stderr[-3000:]
    assert {result["outcome"] for result in tests.values()} == {"passed"}, done.stderr[-3000:]
