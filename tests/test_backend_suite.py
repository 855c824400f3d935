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

#: The suite's operator files CI runs on the coreai flow, on the path a user takes (``lower()``, ExecuTorch's IR
#: check on): add (its ``alpha`` rule) and the ops neither the converter nor the portable kernels run
#: (``partition/kernel_gaps.py``: adaptive_maxpool2d and median, 95 s between them here, each case a dozen lowerings;
#: round's decimals, outside the Core ATen opset the IR check allows).  Every other file runs in
#: ``benchmarks/suite.py``: the heaviest files of the rules (amax, index_put, maxpool2d, a minute each here),
#: avgpool2d, the ordinary files; each rule is pinned by its own case in ``test_claims.py``, ``test_claims_ops.py``
#: or ``test_claims_pooling.py``.
CI_OPERATORS = (
    "test_add",
    "test_adaptive_maxpool2d",
)
#: The suite's own reasons to skip a case on any flow (its ``run_test``): none says anything of the coreai flow.
SUITES_SKIPS = ("In place activations aren't properly defunctionalized yet.", "NaN and Inf are not enforced for backends.")

#: The suite's skip for a case whose model eager PyTorch itself refuses (its inputs do not fit it), with eager's error.
EAGER_REFUSED = "Test failed for reasons other than backend failure. Error: "


def skipped_for_the_suites_own_reason(reason: str) -> bool:
    """Whether a skip's reason is the suite's (:data:`SUITES_SKIPS`) or eager PyTorch's error on the case's own model;
    not a flow's (ops it left outside that the portable kernels lack), nor a failure with no error to name."""
    if reason in SUITES_SKIPS:
        return True
    return reason.startswith(EAGER_REFUSED) and reason.removeprefix(EAGER_REFUSED) not in ("", "None")


def test_a_skip_counts_as_the_suites_only_for_its_own_reasons():
    assert skipped_for_the_suites_own_reason("NaN and Inf are not enforced for backends.")
    assert skipped_for_the_suites_own_reason(EAGER_REFUSED + "mat1 and mat2 shapes cannot be multiplied (16x64 and 67x43")
    assert not skipped_for_the_suites_own_reason(EAGER_REFUSED + "None")
    assert not skipped_for_the_suites_own_reason("ops outside the delegate include one the portable kernels lack: aten::median")
    assert not skipped_for_the_suites_own_reason("skipped")


def test_the_plugin_adds_the_coreai_flow_to_the_suites_flows():
    import backend_suite.plugin  # noqa: F401
    from executorch.backends.test.suite.flow import all_flows

    flows = all_flows()
    assert flows["coreai"].backend == "coreai"
    assert {"portable", "xnnpack"} <= set(flows)


@pytest.mark.slow
def test_the_suites_operator_files_pass_on_the_coreai_flow():
    # In one process (workers=0): a crash fails the run, and no second process imports ExecuTorch again.
    cases = run.run([f"operators.{name}" for name in CI_OPERATORS], ["coreai"], workers=0)
    assert {case.module for case in cases} == set(CI_OPERATORS), "a named operator file collected no coreai case"
    failed = [case for case in cases if case.outcome not in ("passed", "skipped", "xfailed")]
    assert not failed, "cases of ExecuTorch's backend suite that fail on the coreai flow:\n" + "\n".join(
        f"  {case.nodeid}: {case.detail}: {case.error[:300]}" for case in failed
    )
    skipped = [case for case in cases if case.outcome == "skipped" and not skipped_for_the_suites_own_reason(case.detail)]
    assert not skipped, "cases skipped for a reason that is the coreai flow's, not the suite's:\n" + "\n".join(
        f"  {case.nodeid}: {case.detail}" for case in skipped
    )
    # the rules refuse a file's odd arguments, not its op: each file that passes a case delegates one of them
    passing = {case.module for case in cases if case.outcome == "passed"}
    delegating = {case.module for case in cases if case.detail == "delegated"}
    assert passing <= delegating, f"files none of whose cases delegated anything: {sorted(passing - delegating)}"
