"""Run ExecuTorch's own Core AI tests against this project's partitioner and backend.

    python tests/upstream/shim.py [--json results.json] [-k PATTERN]

The installed wheel's ``executorch/backends/apple/coreai/test`` modules run
unchanged under ``unittest``; before they are imported, upstream's
``CoreAIPartitioner`` and ``CoreAIBackend`` names are bound to
``coreai_partitioner.CoreAIPartitioner`` and ``CoreAICompositeBackend``, so
every lowering, ``preprocess`` call and ``.pte`` in them is ours.  Our
partitioner delegates under upstream's backend id (``CoreAIBackend``) here,
and upstream's class runs our ``preprocess``: the tests assert that id.

Run it with ``unittest`` in a process of its own, never under pytest: pytest
would put ``executorch/backends/apple`` (no ``__init__.py``) on ``sys.path``,
and ``import coreai`` would find the wrong package.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import unittest
import warnings
from pathlib import Path

UPSTREAM = "executorch.backends.apple.coreai"
MODULES = ("test_io_compat", "test_partitioner", "test_preprocess", "test_quantizer", "test_recipes", "test_shape_config")
#: Upstream tests that call neither the partitioner nor the backend (upstream's quantizer against coreai-opt's own
#: finalize, on a conv-BN model): 90 of the run's 168 s here.  Recorded as skipped unless ``--all``.
QUANTIZER_ONLY = (
    "test_quantizer.CoreAIQuantizerConvBNTest.test_convert_folds_conv_bn",
    "test_quantizer.CoreAIQuantizerConvBNTest.test_convert_matches_full_finalize_conv_bn",
)
LEFT_OUT = "calls neither the partitioner nor the backend: run with --all (the benchmark tier)"


def swap_in_ours() -> None:
    """Bind upstream's partitioner and backend names to ours, before any upstream test imports them."""
    warnings.filterwarnings("ignore")
    upstream = importlib.import_module(UPSTREAM)
    partition = importlib.import_module(f"{UPSTREAM}.partition.partitioner")
    preprocess = importlib.import_module(f"{UPSTREAM}.compiler.preprocess")
    import coreai_partitioner.partition.partitioner as ours_partitioner
    from coreai_partitioner import CoreAIPartitioner
    from coreai_partitioner.backends.apple_coreai import CoreAICompositeBackend

    upstream_backend = preprocess.CoreAIBackend
    # Delegate under upstream's id, and make that id's class run our backend.
    ours_partitioner.BACKEND_ID = upstream_backend.__name__
    upstream_backend.preprocess = staticmethod(CoreAICompositeBackend.preprocess)
    upstream_backend.copy_exported_program_for_preprocess = CoreAICompositeBackend.copy_exported_program_for_preprocess
    for module in (upstream, partition):
        module.CoreAIPartitioner = CoreAIPartitioner
    for module in (upstream, preprocess):
        module.CoreAIBackend = upstream_backend


class _Recorder(unittest.TextTestResult):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, dict] = {}
        self._started: dict[str, float] = {}

    def startTest(self, test) -> None:
        self._started[test.id()] = time.perf_counter()
        super().startTest(test)

    def _record(self, test, outcome: str, detail: str = "") -> None:
        seconds = time.perf_counter() - self._started.get(test.id(), time.perf_counter())
        self.outcomes[test.id()] = {"outcome": outcome, "detail": detail, "seconds": round(seconds, 2)}

    def addSuccess(self, test) -> None:
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err) -> None:
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err) -> None:
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason) -> None:
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err) -> None:
        super().addExpectedFailure(test, err)
        self._record(test, "expected failure", self._exc_info_to_string(err, test))

    def addUnexpectedSuccess(self, test) -> None:
        super().addUnexpectedSuccess(test)
        self._record(test, "unexpected success")


def _without(suite: unittest.TestSuite, names: tuple[str, ...]) -> list:
    """The tests of ``suite``, those whose id ends with one of ``names`` skipped with :data:`LEFT_OUT`."""
    tests = []
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            tests += _without(test, names)
        elif test.id().endswith(names):
            setattr(test, test._testMethodName, unittest.skip(LEFT_OUT)(getattr(test, test._testMethodName)))
            tests.append(test)
        else:
            tests.append(test)
    return tests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write {test id: outcome} here")
    parser.add_argument("-k", dest="patterns", action="append", help="only tests matching (unittest -k)")
    parser.add_argument("--all", action="store_true", help="the QUANTIZER_ONLY tests too")
    args = parser.parse_args()

    swap_in_ours()
    loader = unittest.TestLoader()
    if args.patterns:
        loader.testNamePatterns = [p if "*" in p else f"*{p}*" for p in args.patterns]
    suite = unittest.TestSuite(
        loader.loadTestsFromModule(importlib.import_module(f"{UPSTREAM}.test.{name}")) for name in MODULES
    )
    if not args.all:
        suite = unittest.TestSuite(_without(suite, QUANTIZER_ONLY))
    start = time.perf_counter()
    result = unittest.TextTestRunner(resultclass=_Recorder, verbosity=2, stream=sys.stderr).run(suite)
    seconds = time.perf_counter() - start
    counts: dict[str, int] = {}
    for outcome in result.outcomes.values():
        counts[outcome["outcome"]] = counts.get(outcome["outcome"], 0) + 1
    print(f"{len(result.outcomes)} upstream test(s) in {seconds:.0f} s: "
          + ", ".join(f"{n} {o}" for o, n in sorted(counts.items())))
    if args.json:
        args.json.write_text(json.dumps({"seconds": seconds, "tests": result.outcomes}, indent=1, sort_keys=True))
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
