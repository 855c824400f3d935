"""ExecuTorch's backend test suite on the coreai, xnnpack and portable flows, side by side in one run.

    python benchmarks/suite.py                      # every operator file; writes benchmarks/results/backend_suite.*
    python benchmarks/suite.py --suite models       # the torchvision models (about an hour)
    python benchmarks/suite.py --load benchmarks/results/backend_suite.json   # the tables again

The suite is the executorch wheel's (``executorch/backends/test/suite``);
``tests/backend_suite/`` adds this package's coreai flow to it.  Each flow
runs the same cases with the same seed (the suite seeds each case from its
name), in pytest-xdist workers so that a case that kills its process is one
failed case.  A pass is "delegated" when the ``.pte`` has a delegate call,
"nothing delegated" when the flow left every op to the portable kernels;
portable delegates nothing by design.  Runtimes are this machine's: the
coreai flow's delegates run on coreai-core's Linux CPU runtime, not a device.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from backend_suite import run  # noqa: E402

RESULTS = HERE / "results"
FLOWS = ("coreai", "xnnpack", "portable")


def operator_modules() -> list[str]:
    """The suite's operator files, found without importing ExecuTorch (which logs as it imports)."""
    folder = Path(importlib.util.find_spec("executorch").submodule_search_locations[0]) / "backends/test/suite/operators"
    return sorted(f"operators.{path.stem}" for path in folder.glob("test_*.py"))


def measure(suite: str, flows: list[str], workers: int, keyword: str | None) -> dict:
    modules = operator_modules() if suite == "operators" else ["models.test_torchvision"]
    commit = subprocess.run(["git", "-C", str(HERE), "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
    started = time.perf_counter()
    cases = run.run(modules, flows, workers=workers, timeout=1200 if suite == "models" else 120, keyword=keyword)
    return {
        "suite": suite,
        "commit": commit,
        "flows": flows,
        "workers": workers,
        "seconds": round(time.perf_counter() - started, 1),
        "cases": [asdict(case) for case in cases],
    }


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    line = lambda row: "| " + " | ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(row) for row in rows])


def report(results: dict) -> str:
    cases = [run.Case(**case) for case in results["cases"]]
    flows = results["flows"]
    lines = [
        f"ExecuTorch backend suite ({results['suite']}), flows {', '.join(flows)}, one run: "
        f"{results['seconds']:.0f} s on {results['workers']} pytest-xdist workers, at commit {results.get('commit', '?')}",
        "",
    ]
    summary = []
    for flow in flows:
        mine = [case for case in cases if case.flow == flow]
        count = Counter(case.outcome for case in mine)
        details = Counter(case.detail for case in mine if case.outcome == "failed")
        summary.append([
            flow, len(mine), count["passed"], sum(case.detail == "nothing delegated" for case in mine if case.outcome == "passed"),
            count["failed"], ", ".join(f"{detail} {n}" for detail, n in details.most_common()) or "-",
            count["skipped"], count["xfailed"],
        ])
    lines.append(table(summary, ["flow", "cases", "passed", "of which delegated nothing", "failed", "failures", "skipped", "xfailed"]))
    for flow in flows:
        failed = [case for case in cases if case.flow == flow and case.outcome == "failed"]
        if failed:
            lines += ["", f"{flow}: failed cases"]
            lines += [f"  {case.nodeid}: {case.detail}: {case.error.splitlines()[0][:160] if case.error else ''}" for case in failed]
    skipped = Counter((case.flow, case.detail[:140]) for case in cases if case.outcome == "skipped")
    if skipped:
        lines += ["", "skipped cases, by reason"]
        lines += [f"  {flow}: {n} x {reason}" for (flow, reason), n in sorted(skipped.items())]
    if results["suite"] == "models":
        rows = []
        for case in cases:
            rows.append([
                case.nodeid, case.outcome, case.detail[:40],
                _fmt(case.lower_seconds, "{:.1f}"), _fmt(case.pte_kb and case.pte_kb / 1000, "{:.1f}"),
                _fmt(case.delegated_nodes, "{}"), _fmt(case.undelegated_nodes, "{}"), _fmt(case.snr_db, "{:.0f}"),
                f"{case.seconds:.1f}",
            ])
        lines += ["", table(rows, ["case", "outcome", "detail", "lower s", ".pte MB", "delegated nodes", "undelegated nodes", "SNR dB", "case s"])]
    return "\n".join(lines)


def _fmt(value: object, form: str) -> str:
    return "-" if value is None else form.format(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=("operators", "models"), default="operators")
    parser.add_argument("--flows", nargs="+", default=list(FLOWS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (a subset of the cases)")
    parser.add_argument("--load", type=Path, help="print the tables of a results file")
    parser.add_argument("--name", help="results file stem (default backend_suite or backend_suite_models)")
    args = parser.parse_args()
    if args.load:
        print(report(json.loads(args.load.read_text())))
        return
    results = measure(args.suite, args.flows, args.workers, args.keyword)
    stem = args.name or ("backend_suite" if args.suite == "operators" else "backend_suite_models")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    text = report(results)
    (RESULTS / f"{stem}.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
