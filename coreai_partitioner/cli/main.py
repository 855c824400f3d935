"""``python -m coreai_partitioner verify|inspect MODEL.pte``, ``export`` (any task, :mod:`coreai_partitioner.cli.export`),
``export-llm`` (its ``text-generation`` task), ``export-optimum`` (optimum-executorch with the coreai recipes) and
``generate-speech`` and ``generate-image`` (a ``text-to-speech`` ``.pte`` to a WAV, a ``text-to-image`` one to a PNG:
each task module's ``add_generate_command``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from coreai_partitioner.cli import flags
from coreai_partitioner.cli.command import one_line_warnings

EXIT_MISMATCH = 1
EXIT_UNSUPPORTED = 2


PROG = "python -m coreai_partitioner"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["export-llm"]:  # the text-generation task, as coreai-export-llm and examples/export_llm.py run it
        from coreai_partitioner.cli.export import export_llm

        return export_llm(argv[1:], prog=f"{PROG} export-llm")
    if argv[:1] == ["export"]:  # the task's own parser, picked from the checkpoint (cli/export.py)
        from coreai_partitioner.cli.export import main as export

        return export(argv[1:], prog=f"{PROG} export")
    with one_line_warnings(f"{PROG} {argv[0]}" if argv else PROG):  # an old spelling's deprecation, one line
        args = build_parser().parse_args(argv)
    if args.command == "verify":
        return _verify(args)
    if args.command == "export-optimum":
        return _export_optimum(args)
    if args.run is not None:  # a task's generate-* command
        return args.run(args)
    return _inspect(args)


def build_parser() -> argparse.ArgumentParser:
    """The commands but ``export`` and ``export-llm``, which parse their own lines (named here for ``--help``)."""
    parser = argparse.ArgumentParser(prog=PROG)
    parser.set_defaults(run=None)  # a task's generate-* command sets its own
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "export", add_help=False, help="export any checkpoint, its task read off its config (its --help says how)"
    )
    commands.add_parser(
        "export-llm", add_help=False, help="export a Hugging Face LLM to a .pte for ExecuTorch's LLM runner (its --help says how)"
    )

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

    optimum_parser = commands.add_parser(
        "export-optimum",
        help="optimum-cli export executorch with this project's recipes (coreai, coreai_fp16, coreai_int8, coreai_int4)",
    )
    optimum_parser.add_argument("--model", required=True, help="a local checkpoint directory or a model id")
    optimum_parser.add_argument("--output-dir", type=Path, required=True)
    optimum_parser.add_argument("--recipe", default="coreai")
    # the export command's --dtype and --max-context-len; its --max-seq-len (the cache length here) parses, deprecated
    flags.add(optimum_parser, ("--dtype", "--max-context-len"), flags.OPTIMUM_DEPRECATED,
              dtype=dict(type=flags.old_dtype), max_context_len=dict(default=2048))

    from coreai_partitioner.cli.detect import tasks

    for task in tasks().values():  # the loops that run a task's .pte: generate-speech, generate-image
        task.add_generate_command(commands)
    return parser


def _export_optimum(args: argparse.Namespace) -> int:
    from coreai_partitioner.recipes.optimum import RECIPES, main_export

    if args.recipe not in RECIPES:
        print(f"no recipe named {args.recipe!r}; choose one of {', '.join(RECIPES)}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    args.output_dir.mkdir(parents=True, exist_ok=True)
    dtype = str(flags.DTYPES[args.dtype]).removeprefix("torch.")  # optimum's loader takes torch's name
    main_export(str(args.model), str(args.output_dir), recipe=args.recipe, max_seq_len=args.max_context_len, dtype=dtype)
    print(f"wrote {args.output_dir / 'model.pte'}")
    return 0


def _load_tensors(path: Path) -> tuple[torch.Tensor, ...]:
    value = torch.load(path, weights_only=True)
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in value):
        return tuple(value)
    raise SystemExit(f"{path}: expected a tensor or a tuple/list of tensors, got {type(value).__name__}")


def _verify(args: argparse.Namespace) -> int:
    from coreai_partitioner import verify

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
    from coreai_partitioner.verify.table import table

    rows = []
    for index, output in enumerate(outputs):
        values = output.to(torch.float64)
        rows.append(
            [index, tuple(output.shape), str(output.dtype).replace("torch.", ""),
             f"{float(values.min()):.4g}", f"{float(values.max()):.4g}", f"{float(values.mean()):.4g}"]
        )
    return table(rows, ["output", "shape", "dtype", "min", "max", "mean"])


def _inspect(args: argparse.Namespace) -> int:
    from coreai_partitioner.verify.describe import describe

    print(describe(args.pte, sidecar_dir=args.sidecar_dir, graphs=True))
    return 0
