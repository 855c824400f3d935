"""What the row benchmarks share (``text_to_speech.py``, ``text_to_image.py``): the command line, each row measured in
a process of its own (its peak RSS its own), the table they print and the results files they write."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def table(rows: list[dict], columns: tuple[str, ...]) -> str:
    """``rows`` as a Markdown table of ``columns``, each column as wide as its widest cell."""
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(r[c]).ljust(w) for c, w in zip(columns, widths)) + " |" for r in rows]
    return "\n".join(lines)


def main(
    script: str, doc: str, rows: dict[str, Any], columns: tuple[str, ...], worker: Callable[[str, int], dict],
    stem: str, what: str, plot: Callable[[list[dict], Path], None] | None = None,
) -> None:
    """A row benchmark's command: ``--rows`` (each run by ``worker(name, runs)`` in a process of its own, ``script``
    again with ``--worker``), ``--runs``, ``--results`` (``STEM.txt`` and ``STEM.json`` written there; ``what`` the
    header's note on the rows), and ``--plot`` where ``plot`` is given (``STEM.png`` drawn from the results file)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=tuple(rows), default=list(rows))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--results", type=Path, default=RESULTS)
    if plot is not None:
        parser.add_argument("--plot", action="store_true", help="draw the results file's rows, run nothing")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if getattr(args, "plot", False):
        plot(json.loads((args.results / f"{stem}.json").read_text()), args.results / f"{stem}.png")
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.runs)))
        return
    measured = []
    for name in args.rows:
        done = subprocess.run([sys.executable, script, "--worker", name, "--runs", str(args.runs)],
                              capture_output=True, text=True, check=True)
        measured.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{name}: done", file=sys.stderr)
    header = (f"python benchmarks/{Path(script).name} --rows {' '.join(args.rows)} --runs {args.runs}   "
              f"(one run, {time.strftime('%Y-%m-%d')}, coreai-core's Linux CPU runtime, 2 cores; {what})")
    text = header + "\n\n" + table(measured, columns) + "\n"
    print(text)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{stem}.txt").write_text(text)
    (args.results / f"{stem}.json").write_text(json.dumps(measured, indent=1) + "\n")
