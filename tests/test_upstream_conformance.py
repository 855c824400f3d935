"""ExecuTorch's own Core AI tests, run against our partitioner and backend (tests/upstream/shim.py).

The shim runs the installed wheel's ``executorch/backends/apple/coreai/test``
modules with ``unittest`` in a process of its own (under pytest,
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

pytest.importorskip("coreai_opt")  # upstream's quantizer tests need it (the quantize extra)

pytestmark = pytest.mark.slow

SHIM = Path(__file__).parent / "upstream" / "shim.py"
UPSTREAM_TESTS = 93  # executorch 1.5.1

#: Tests that need macOS (``xcrun coreai-build``, the Metal toolchain); upstream skips them elsewhere.
MACOS_ONLY = {
    "test_preprocess.CoreAIAOTCompileTest.test_aot_inline_embeds_aimodelc": "compiles .aimodelc with xcrun coreai-build",
    "test_preprocess.CoreAIAOTCompileTest.test_aot_sidecar_writes_aimodelc_and_keeps_pte_small": "compiles .aimodelc with xcrun coreai-build",
    "test_preprocess.CoreAIAOTCompileTest.test_delegates_present": "compiles .aimodelc with xcrun coreai-build",
}


def test_upstream_coreai_tests_pass_against_our_partitioner_and_backend(tmp_path):
    results = tmp_path / "upstream.json"
    run = subprocess.run(
        [sys.executable, str(SHIM), "--json", str(results)], capture_output=True, text=True, timeout=1800
    )
    assert results.exists(), f"the upstream suite did not finish:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    tests = json.loads(results.read_text())["tests"]
    short = {test_id.removeprefix("executorch.backends.apple.coreai.test."): outcome for test_id, outcome in tests.items()}
    assert len(short) == UPSTREAM_TESTS, f"expected {UPSTREAM_TESTS} upstream tests, ran {len(short)}"

    expected_outcome = "passed" if sys.platform == "darwin" else "skipped"
    wrong = {
        name: f"{result['outcome']} (expected {expected_outcome if name in MACOS_ONLY else 'passed'})\n{result['detail'][-1500:]}"
        for name, result in short.items()
        if result["outcome"] != (expected_outcome if name in MACOS_ONLY else "passed")
    }
    assert not wrong, "upstream Core AI tests that do not pass against ours:\n\n" + "\n\n".join(
        f"{name}: {why}" for name, why in sorted(wrong.items())
    )
