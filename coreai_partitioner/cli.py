"""``python -m coreai_partitioner verify|inspect MODEL.pte``."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

EXIT_MISMATCH = 1
EXIT_UNSUPPORTED = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coreai_partitioner")
    commands = parser.add_subparsers(dest="command", required=True)

    verify_parser = commands.add_parser(
        "verify", help="run a .pte in ExecuTorch's runtime (Core AI delegates on the host backend) and compare"
    )
    verify_parser.add_argument("pte", type=Path)
    verify_parser.add_argument("--inputs", type=Path, required=True, help="torch.save'd tensor or tuple of tensors")
    verify_parser.add_argument("--reference", type=Path, help="torch.save'd expected output(s)")
    verify_parser.add_argument("--method", default="forward")
    verify_parser.add_argument("--rtol", type=float)
    verify_parser.add_argument("--atol", type=float)
    verify_parser.add_argument("--sidecar-dir", type=Path, help="where sidecar assets are (default: the .pte's directory)")

    inspect_parser = commands.add_parser("inspect", help="list a .pte's methods, delegates and Core AI assets")
    inspect_parser.add_argument("pte", type=Path)
    inspect_parser.add_argument("--sidecar-dir", type=Path)

    args = parser.parse_args(argv)
    if args.command == "verify":
        return _verify(args)
    return _inspect(args)


def _load_tensors(path: Path) -> tuple[torch.Tensor, ...]:
    value = torch.load(path, weights_only=True)
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in value):
        return tuple(value)
    raise SystemExit(f"{path}: expected a tensor or a tuple/list of tensors, got {type(value).__name__}")


def _verify(args: argparse.Namespace) -> int:
    from . import verify

    inputs = _load_tensors(args.inputs)
    sidecar_dir = args.sidecar_dir or args.pte.parent
    try:
        if args.reference is None:
            outputs = verify.run(args.pte, *inputs, method=args.method, sidecar_dir=sidecar_dir)
            print(_describe_outputs(outputs))
            return 0
        report = verify.check(
            args.pte.read_bytes(),
            _load_tensors(args.reference),
            *inputs,
            rtol=args.rtol,
            atol=args.atol,
            method=args.method,
            sidecar_dir=sidecar_dir,
        )
    except verify.UnsupportedProgram as error:
        print(f"unsupported program: {error}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    except RuntimeError as error:  # the runtime refused the inputs or a delegate failed
        print(f"run failed: {error}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    print(report)
    return 0 if report.ok else EXIT_MISMATCH


def _describe_outputs(outputs: tuple[torch.Tensor, ...]) -> str:
    lines = [f"{'output':>6}  {'shape':<18} {'dtype':<9} {'min':>11} {'max':>11} {'mean':>11}"]
    for index, output in enumerate(outputs):
        values = output.to(torch.float64)
        lines.append(
            f"{index:>6}  {str(tuple(output.shape)):<18} {str(output.dtype).replace('torch.', ''):<9} "
            f"{float(values.min()):>11.4g} {float(values.max()):>11.4g} {float(values.mean()):>11.4g}"
        )
    return "\n".join(lines)


def _inspect(args: argparse.Namespace) -> int:
    from .assets import asset_ir, summarize_ir
    from .pte import read_pte

    contents = read_pte(args.pte)
    sidecar_dir = args.sidecar_dir or args.pte.parent
    print(f"{args.pte}: {contents.size:,} bytes, {len(contents.methods)} method(s)")
    with tempfile.TemporaryDirectory() as directory:
        for method in contents.methods:
            plan = contents.plans[method]
            count, calls = len(plan.instructions), len(plan.delegate_calls)
            delegates = [d for d in contents.delegates if d.method == method]
            print(f"method '{method}': {count} instruction(s), {calls} delegate call(s), {len(delegates)} delegate(s)")
            for delegate in delegates:
                _print_delegate(delegate, directory, sidecar_dir, asset_ir, summarize_ir)
    return 0


def _print_delegate(delegate: Any, directory: str, sidecar_dir: Path, asset_ir: Any, summarize_ir: Any) -> None:
    size = f"{delegate.asset_bytes:,} bytes" if delegate.files else "asset outside the .pte"
    print(f"  delegate {delegate.index}: {delegate.backend_id}, {delegate.packaging or 'not Core AI'}, {size}")
    if not delegate.is_coreai:
        return
    try:
        path = delegate.asset_path(directory, sidecar_dir=sidecar_dir)
    except (ValueError, FileNotFoundError) as error:
        print(f"    ({error})")
        return
    summary = summarize_ir(asset_ir(path))
    print(f"    graphs: {len(summary.graphs)} ({sum(g.noinline for g in summary.graphs)} noinline)")
    for graph in summary.graphs:
        flags = " noinline" if graph.noinline else ""
        composite = f"  composite {graph.composite} {{{graph.composite_attrs or ''}}}" if graph.composite else ""
        print(f"      @{graph.name}{flags}{composite}")
    declared = sorted({(g.composite, g.composite_attrs or "") for g in summary.graphs if g.composite})
    print(f"    composite declarations: {len(declared)}")
    for name, attrs in declared:
        print(f"      {name} {{{attrs}}}")
    print(f"    coreai.invoke: {summary.invoke_count}")
    for name, count in sorted(summary.composites().items()):
        print(f"      {name}: {count} call site(s)")
