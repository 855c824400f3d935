"""Run ExecuTorch's backend test suite on named flows in a pytest process of its own, and read its results.

The suite lives in the executorch wheel (``executorch.backends.test.suite``);
it is collected by module name (``--pyargs``), with ``backend_suite.plugin``
adding this package's flows.  Its own ``conftest.py`` records what each case
did (delegated and undelegated nodes, lowering time, ``.pte`` size, the
result's detail) in pytest-json-report's metadata, which :func:`run` reads
back as :class:`Case` rows.  Cases run in pytest-xdist workers, so a case
that kills its process (a crash inside a runtime) is one failed case, not a
lost run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from backend_suite import environment

SUITE = "executorch.backends.test.suite"


@dataclass(frozen=True)
class Case:
    """One test case of the suite on one flow, as its run ended."""

    nodeid: str
    module: str  # the suite's file: test_add
    flow: str
    outcome: str  # pytest's: passed, failed, skipped, xfailed, xpassed, error
    detail: str  # "delegated" or "nothing delegated" for a pass; the suite's failure ("Lowering Failed", "Output Mismatch", "Process Crash"...); the skip reason
    error: str
    delegated_nodes: int | None
    undelegated_nodes: int | None
    lower_seconds: float | None
    pte_kb: float | None
    snr_db: float | None  # the least SNR over the outputs, against eager
    seconds: float


def command(
    modules: list[str], flows: list[str], report: Path, *, workers: int = 1, timeout: int | None = None, keyword: str | None = None
) -> list[str]:
    """The pytest command that runs ``modules`` (``operators.test_add``, ``models.test_torchvision``) on ``flows``."""
    args = [
        sys.executable, "-m", "pytest",
        "-c", os.devnull, "--rootdir", tempfile.gettempdir(), "--import-mode=importlib",
        "-p", "backend_suite.plugin", "-p", "no:cacheprovider",
        "-W", "ignore::pytest.PytestUnknownMarkWarning",
        "-m", " or ".join(f"flow_{flow}" for flow in flows),
        "-n", str(workers), "-q", "-rN", "--tb=no", "-p", "no:warnings",
        "--json-report", f"--json-report-file={report}", "--json-report-omit", "collectors", "log", "streams", "traceback",
    ]
    if timeout is not None:
        args += ["--timeout", str(timeout)]
    if keyword is not None:
        args += ["-k", keyword]
    return args + ["--pyargs"] + [f"{SUITE}.{module}" for module in modules]


def run(
    modules: list[str],
    flows: list[str],
    *,
    workers: int = 1,
    timeout: int | None = None,
    keyword: str | None = None,
    keep_report: Path | None = None,
) -> list[Case]:
    """Run the suite's ``modules`` on ``flows`` in a new process; the cases, in the order they were collected."""
    with tempfile.TemporaryDirectory(prefix="backend-suite-") as scratch:
        report = keep_report or Path(scratch) / "report.json"
        completed = subprocess.run(
            command(modules, flows, report, workers=workers, timeout=timeout, keyword=keyword),
            env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        if not report.exists():
            raise RuntimeError(f"the backend suite wrote no report (exit {completed.returncode}):\n{completed.stdout[-4000:]}")
        return cases(json.loads(report.read_text()))


def cases(report: dict) -> list[Case]:
    """The :class:`Case` rows of a pytest-json-report report of the suite."""
    rows = []
    for test in report.get("tests", ()):
        subtests = (test.get("metadata") or {}).get("subtests") or [{}]
        last = subtests[-1]
        flow = last.get("Flow") or _flow_of(test["nodeid"])
        if test["outcome"] == "skipped":
            detail = _skip_reason(test)
            if detail.endswith("Error: None") and last.get("Undelegated Ops"):
                # run_test skips a case whose undelegated ops the portable kernels lack (UNSUPPORTED_PORTABLE_OPS)
                detail = "ops outside the delegate include one the portable kernels lack: " + ", ".join(sorted(last["Undelegated Ops"]))
        elif last.get("Result") == "Pass":
            detail = "delegated" if last.get("Delegated") == "True" else "nothing delegated"
        else:
            detail = last.get("Result Detail") or ("Process Crash" if "crash" in json.dumps(test).lower() else test["outcome"])
        snrs = [_number(value, float) for key, value in last.items() if key.startswith("Output ") and key.endswith(" SNR")]
        rows.append(
            Case(
                nodeid=test["nodeid"].removeprefix("::"),
                module=next((word.removesuffix(".py") for word in test.get("keywords", ()) if word.endswith(".py")), ""),
                flow=flow,
                outcome=test["outcome"],
                detail=detail,
                error=last.get("Error") or "",
                delegated_nodes=_number(last.get("Delegated Nodes"), int),
                undelegated_nodes=_number(last.get("Undelegated Nodes"), int),
                lower_seconds=_number(last.get("Lower Time (s)"), float),
                pte_kb=_number(last.get("PTE Size (Kb)"), float),
                snr_db=min((snr for snr in snrs if snr is not None), default=None),
                seconds=sum(test.get(stage, {}).get("duration", 0.0) for stage in ("setup", "call", "teardown")),
            )
        )
    return rows


def tally(rows: list[Case]) -> dict[str, Counter]:
    """Per flow: how many cases passed (split by whether anything was delegated), failed, were skipped."""
    counts: dict[str, Counter] = {}
    for case in rows:
        count = counts.setdefault(case.flow, Counter())
        count[case.outcome] += 1
        if case.outcome == "passed" and case.detail == "nothing delegated":
            count["passed, nothing delegated"] += 1
    return counts


def _flow_of(nodeid: str) -> str:
    return nodeid.rsplit("[", 1)[-1].split("-", 1)[0].rstrip("]") if "[" in nodeid else ""


def _skip_reason(test: dict) -> str:
    """The text after "Skipped: " in the stage that skipped (xdist puts its worker's line first)."""
    for stage in ("setup", "call"):
        longrepr = str((test.get(stage) or {}).get("longrepr") or "")
        if "Skipped: " in longrepr:
            return longrepr.split("Skipped: ", 1)[1].rstrip("')\"")
    return "skipped"


def _number(text: object, kind: type) -> object:
    try:
        return kind(text) if text not in (None, "") else None
    except (TypeError, ValueError):
        return None
