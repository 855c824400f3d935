"""ExecuTorch's backend test suite on the coreai flow (tests/backend_suite/), in a process of its own.

CI runs a fixed subset of the suite's operator files (:data:`CI_OPERATORS`):
the ones whose arguments the partitioner's per-op rules judge
(``coreai_partitioner/partition/claims/``), and a few ordinary ones.
``benchmarks/suite.py`` runs every file, on the coreai, xnnpack and
portable flows side by side (``benchmarks/results/backend_suite.txt``).
"""

from __future__ import annotations

import pytest

from requires import require

require("pytest_timeout", "test")  # the suite marks every case with a timeout
require("pytest_jsonreport", "test")  # its results are read from pytest-json-report's file

from backend_suite import run  # noqa: E402

#: The suite's operator files CI runs on the coreai flow: one file for each family of rules in ``claims/`` (add's
#: ``alpha``; amax's reductions over every dim, mean's rule too; squeeze; index_put's accumulate and broadcast; the
#: pools' ceil_mode, padding and indices), linear, an ordinary op, and the ops neither the converter nor the portable
#: kernels run (``partition/kernel_gaps.py``: adaptive_maxpool2d, median; round's decimals).  The rest run in ``benchmarks/suite.py``
#: (the transposed 3-d convolution's cases all skip there, the portable kernels lacking it; ``test_claims.py`` pins
#: that its lowering does not die).
CI_OPERATORS = (
    "test_add",
    "test_amax",
    "test_squeeze",
    "test_index_put",
    "test_avgpool2d",
    "test_maxpool2d",
    "test_linear",
    "test_adaptive_maxpool2d",
    "test_median",
    "test_round",
)


def test_the_plugin_adds_the_coreai_flow_to_the_suites_flows():
    import backend_suite.plugin  # noqa: F401
    from executorch.backends.test.suite.flow import all_flows

    flows = all_flows()
    assert flows["coreai"].backend == "coreai"
    assert {"portable", "xnnpack"} <= set(flows)


@pytest.mark.slow
def test_the_suites_operator_files_pass_on_the_coreai_flow():
    cases = run.run([f"operators.{name}" for name in CI_OPERATORS], ["coreai"], workers=1)
    assert {case.module for case in cases} == set(CI_OPERATORS), "a named operator file collected no coreai case"
    failed = [case for case in cases if case.outcome not in ("passed", "skipped", "xfailed")]
    assert not failed, "cases of ExecuTorch's backend suite that fail on the coreai flow:\n" + "\n".join(
        f"  {case.nodeid}: {case.detail}: {case.error[:300]}" for case in failed
    )
    assert all(case.detail for case in cases if case.outcome == "skipped"), "a skip without its reason"
    # the rules refuse a file's odd arguments, not its op: each file that passes a case delegates one of them
    passing = {case.module for case in cases if case.outcome == "passed"}
    delegating = {case.module for case in cases if case.detail == "delegated"}
    assert passing <= delegating, f"files none of whose cases delegated anything: {sorted(passing - delegating)}"
