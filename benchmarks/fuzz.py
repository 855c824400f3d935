"""Long fuzzing run: random small transformer-like models, lowered and checked on the Core AI runtime.

    python benchmarks/fuzz.py --examples 200

Prints how many examples ran and every failure with its config; turn each
failure into a named regression test in tests/test_fuzz.py.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, help="make the run reproducible")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    from fuzz_models import build, configs, sample, specs
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from coreai_partitioner import verify
    from coreai_partitioner.verify.testing import assert_lowers_and_matches

    ran, failures = [], []
    start = time.perf_counter()

    @settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(configs())
    def run(config):
        ran.append(config)
        try:
            assert_lowers_and_matches(build(config), sample(config), specs=specs(config))
        except Exception as error:  # noqa: BLE001 - every failure is reported, none stops the run
            failures.append((config, f"{type(error).__name__}: {error}", traceback.format_exc()))
            print(f"  FAILED #{len(ran)}: {config}\n    {type(error).__name__}: {str(error)[:300]}", flush=True)
        verify.clear_cache()
        if len(ran) % 10 == 0:
            print(f"  {len(ran)} example(s), {len(failures)} failure(s), {time.perf_counter() - start:.0f} s", flush=True)

    if args.seed is not None:
        run = seed(args.seed)(run)
    run()
    print(f"\nexamples run: {len(ran)}, failures: {len(failures)}, {time.perf_counter() - start:.0f} s")
    for config, message, _ in failures:
        print(f"- {config}\n  {message[:500]}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
