"""Lowering time and peak memory: this plugin vs coreai-torch one-shot vs the Core ML partitioner.

    python benchmarks/lowering.py --layers 4 8 16 --dim 256 --paths plugin coreai-torch coreml

Each (path, L, d) runs in a process of its own, so peak RSS is honest.  "+MB"
is peak RSS above the process right after it built the model.  Prints a table
and the ratios against the targets, and writes a PNG of time and memory
against L (``--plot``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
PATHS = ("plugin", "coreai-torch", "coreml")


def _rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def worker(path: str, layers: int, dim: int, dtype_name: str) -> dict:
    warnings.simplefilter("ignore")
    import torch

    sys.path.insert(0, str(HERE))
    from model import build, weight_bytes

    dtype = {"fp32": torch.float32, "fp16": torch.float16}[dtype_name]
    model, x = build(layers, dim, dtype)
    phases: dict[str, float] = {}
    _reset_peak()
    base = _rss_mb("VmRSS")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        if path == "plugin":
            _plugin(model, x, directory, phases)
        elif path == "coreai-torch":
            _coreai_torch(model, x, directory, phases)
        else:
            _coreml(model, x, directory, phases)
    seconds = time.perf_counter() - start
    return {
        "path": path,
        "layers": layers,
        "dim": dim,
        "dtype": dtype_name,
        "seconds": seconds,
        "peak_mb": _rss_mb("VmHWM") - base,
        "weight_mb": weight_bytes(model) / 2**20,
        "phases": phases,
    }


def _timed(phases: dict, name: str, fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    phases[name] = time.perf_counter() - start
    return result


def _plugin(model, x, directory, phases):
    import torch
    from coreai_torch import get_decomp_table
    from executorch.exir import to_edge_transform_and_lower

    from coreai_partitioner import (
        CoreAIPartitioner,
        default_specs,
        externalize_modules,
        get_default_compile_config,
        get_default_passes,
    )

    ep, records = _timed(
        phases,
        "externalize",
        lambda: externalize_modules(
            model,
            default_specs(),
            export_fn=lambda m: torch.export.export(m, (x,)).run_decompositions(get_decomp_table()),
        ),
    )
    lowered = _timed(
        phases,
        "lower",
        lambda: to_edge_transform_and_lower(
            ep,
            partitioner=[CoreAIPartitioner(externalized_modules=records)],
            compile_config=get_default_compile_config(),
            transform_passes=get_default_passes(),
        ),
    )
    program = _timed(phases, "to_executorch", lowered.to_executorch)
    _timed(phases, "write", _write, program, directory)


def _write(program, directory) -> None:
    with open(Path(directory, "model.pte"), "wb") as file:
        program.write_to_file(file)


def _coreai_torch(model, x, directory, phases):
    import torch
    from coreai_torch import TorchConverter, get_decomp_table

    from coreai_partitioner import default_specs

    converter = TorchConverter()
    _timed(
        phases,
        "stage",
        lambda: converter.add_pytorch_module(
            model,
            export_fn=lambda m: torch.export.export(m, (x,)).run_decompositions(get_decomp_table()),
            externalize_modules=default_specs(),
        ),
    )
    program = _timed(phases, "to_coreai", converter.to_coreai)
    _timed(phases, "save_asset", lambda: program.save_asset(Path(directory, "model.aimodel")))


def _coreml(model, x, directory, phases):
    import torch
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = _timed(phases, "export", lambda: torch.export.export(model, (x,)))
    lowered = _timed(
        phases, "lower", lambda: to_edge_transform_and_lower(ep, partitioner=[CoreMLPartitioner()])
    )
    program = _timed(phases, "to_executorch", lowered.to_executorch)
    _timed(phases, "write", _write, program, directory)


def measure(path: str, layers: int, dim: int, dtype: str) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--worker", path, "--layers", str(layers), "--dim", str(dim), "--dtype", dtype],
        capture_output=True,
        text=True,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"{path} L={layers} d={dim} failed:\n{result.stderr[-4000:]}")
    return json.loads(lines[-1])


def table(results: list[dict]) -> str:
    rows = [f"{'path':<13}{'L':>4}{'d':>6}{'weights MB':>12}{'seconds':>10}{'+MB':>9}{'+MB/weights':>13}  phases"]
    for r in results:
        phases = ", ".join(f"{k} {v:.1f}s" for k, v in r["phases"].items())
        rows.append(
            f"{r['path']:<13}{r['layers']:>4}{r['dim']:>6}{r['weight_mb']:>12.0f}{r['seconds']:>10.1f}"
            f"{r['peak_mb']:>9.0f}{r['peak_mb'] / r['weight_mb']:>13.2f}  {phases}"
        )
    return "\n".join(rows)


def ratios(results: list[dict]) -> str:
    by = {(r["path"], r["layers"], r["dim"]): r for r in results}
    lines = []
    for (path, layers, dim), r in sorted(by.items()):
        if path != "plugin":
            continue
        parts = [f"L={layers:<3} d={dim:<5}"]
        for peer in ("coreai-torch", "coreml"):
            other = by.get((peer, layers, dim))
            if other:
                parts.append(f"time/{peer} {r['seconds'] / other['seconds']:.2f}x")
        double = by.get((path, 2 * layers, dim))
        if double:
            parts.append(f"time(2L)/time(L) {double['seconds'] / r['seconds']:.2f}x")
        parts.append(f"peak/weights {r['peak_mb'] / r['weight_mb']:.2f}x")
        lines.append("  ".join(parts))
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    colors = dict(zip(PATHS, ("tab:blue", "tab:orange", "tab:green")))
    for dim, style in zip(sorted({r["dim"] for r in results}), ("-", "--", ":", "-.")):
        for name in PATHS:
            points = sorted((r["layers"], r["seconds"], r["peak_mb"]) for r in results if r["path"] == name and r["dim"] == dim)
            if points:
                layers, seconds, peak = zip(*points)
                line = dict(marker="o", color=colors[name], linestyle=style, label=f"{name} d={dim}")
                left.plot(layers, seconds, **line)
                right.plot(layers, peak, **line)
    left.set(xlabel="layers L", ylabel="seconds", title="lowering time")
    right.set(xlabel="layers L", ylabel="peak RSS above model (MB)", title="peak memory")
    left.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[16])
    parser.add_argument("--dim", type=int, nargs="+", default=[256])
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32")
    parser.add_argument("--plot", type=Path, help="write a PNG of time and peak memory against L")
    parser.add_argument("--json", type=Path, help="also write the raw results")
    parser.add_argument("--load", type=Path, nargs="+", help="report results written by --json instead of measuring")
    parser.add_argument("--worker", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        print(json.dumps(worker(args.worker, args.layers[0], args.dim[0], args.dtype)))
        return

    results = []
    for path in args.load or []:
        results.extend(json.loads(path.read_text()))
    for dim in [] if args.load else args.dim:
        for layers in args.layers:
            for path in args.paths:
                result = measure(path, layers, dim, args.dtype)
                results.append(result)
                print(f"  {path} L={layers} d={dim}: {result['seconds']:.1f} s, +{result['peak_mb']:.0f} MB", flush=True)
    print()
    print(table(results))
    print()
    print(ratios(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
