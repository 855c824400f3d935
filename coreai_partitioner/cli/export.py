"""``python -m coreai_partitioner export``: one command for every task, picked from the checkpoint's config.

    python -m coreai_partitioner export --checkpoint DIR --out model.pte [--dtype fp16] [--verify] [task options]
    python -m coreai_partitioner export --config NAME --dry-run        # a tiny random model of a family

As ``optimum-cli export`` does, the task comes from the checkpoint's
``config.json``, and files beside it, as each task module declares
(:mod:`.detect`); a checkpoint of another task is refused before any work.
``--task`` names it outright (``--task transcribe`` or ``translate`` is
Whisper's decoder prompt, :data:`SPEECH_TASKS`), and ``--config NAME`` is
the task whose tiny models have that name.  This module is what every task
shares: the common flags (defined in :mod:`.flags`, one name each), the plan
settled before any weights are loaded, loading, the export road (load,
lower, write a staging directory beside ``OUT``, time each phase, print the
sizes), the ``--verify`` gate (the task's eager outputs of what it lowered,
then its check of the ``.pte``), and the files written beside the ``.pte``.  A task is a
module of :mod:`.tasks` that supplies only what is its own
(:class:`~.task.Task`).  ``export-llm``, ``coreai-export-llm`` and
``examples/export_llm.py`` are the ``text-generation`` task
(:func:`export_llm`).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner import console
from coreai_partitioner.cli import detect, flags
from coreai_partitioner.cli.command import CommandError, run_command
from coreai_partitioner.cli.task import Phases, Plan, Task, layer_by_layer

logger = logging.getLogger(__name__)

#: ``--task`` values that are not a task this command exports but speech recognition's decoder prompt (Whisper's
#: ``generate(task=...)``): ``--task translate`` exports Whisper to translate, as ``--speech-task translate`` does.
SPEECH_TASKS = ("transcribe", "translate")

#: The shared flags that count something: each is at least 1.
COUNTS = ("num_layers", "max_context_len", "prefill_chunk", "new_tokens", "max_input_len", "max_batch")


# ---------------------------------------------------------------- the one command


def build_parser(task: Task, prog: str | None = None) -> argparse.ArgumentParser:
    """The task's command line: the source, the common flags, the shared flags it takes, its own."""
    parser = argparse.ArgumentParser(prog=prog, description=task.__doc__.splitlines()[0], epilog=_examples(task),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", choices=task.tiny_configs(), help="a tiny random model of this family")
    source.add_argument("--checkpoint", type=Path, help="a local Hugging Face checkpoint directory")
    flags.add(parser, (*flags.COMMON, *task.FLAGS))
    task.add_flags(parser)
    parser.set_defaults(**{flags.dest(flag): None for flag in flags.NAMES if flag not in (*flags.COMMON, *task.FLAGS)})
    parser.set_defaults(**task.DEFAULTS)
    return parser


def _examples(task: Task) -> str:
    """The task's usage lines (its docstring's indented block)."""
    return "examples:\n" + task.__doc__.split("\n\n")[1] if "\n\n" in task.__doc__ else ""


def run_task(task: Task, argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run ``task``'s command on ``argv``; returns the exit status (errors print one line naming what and the fix)."""
    return run_command(lambda prog: build_parser(task, prog), lambda args: run(task, args), argv, prog)


def export_llm(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``coreai-export-llm``, ``python -m coreai_partitioner export-llm``, ``examples/export_llm.py``: the
    ``text-generation`` task."""
    # The task's own module, not detect.tasks(): that imports every task, and so ExecuTorch, which logs at
    # import, before run_task holds the dependencies down.
    from coreai_partitioner.cli.task import with_defaults
    from coreai_partitioner.cli.tasks import text_generation

    return run_task(with_defaults(text_generation), argv, prog)


def run(task: Task, args: argparse.Namespace) -> None:
    """Settle, then (unless ``--dry-run``) export to a staging directory, verify, keep it as ``--out``, and run it."""
    try:
        plan = settle(task, args)
        if args.dry_run:
            task.dry_run(plan)
            return
        args.out.parent.mkdir(parents=True, exist_ok=True)
        staging = args.out.with_name(f".{args.out.name}.partial")  # every file the export writes, until verified
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            export(task, plan, staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except task.refusals() as error:
        raise CommandError(str(error)) from None
    task.after(plan)


# ---------------------------------------------------------------- before any export work


def settle(task: Task, args: argparse.Namespace) -> Plan:
    """Every check that needs no weights, the shared ones here, the task's own in its ``settle``."""
    if args.checkpoint is None and args.config is None:
        raise CommandError(
            f"give --checkpoint DIR (a local Hugging Face checkpoint) or --config NAME (a tiny random model: "
            f"{', '.join(task.tiny_configs())})"
        )
    for flag in COUNTS:
        value = vars(args)[flag]
        if value is not None and value < 1:
            raise CommandError(f"--{flag.replace('_', '-')} {value}: give at least 1")
    config = model_config(task, args)
    detect.refuse_other_task(task.NAME, args, config)  # before the task's own checks, whatever the task
    plan = task.settle(args, config)
    plan.tokenizer = choose_tokenizer(task, args) if plan.runner_tokenizer else None
    if args.generate is not None and args.checkpoint and plan.tokenizer is None:
        raise CommandError("--generate needs a tokenizer, and this export has none")
    return plan


def model_config(task: Task, args: argparse.Namespace) -> Any:
    """``--checkpoint``'s config (the task's ``load_config``), or ``--config``'s tiny one."""
    if not args.checkpoint:
        return task.tiny_config(args.config)
    return task.load_config(args.checkpoint)


def choose_tokenizer(task: Task, args: argparse.Namespace) -> Any:
    """The checkpoint's tokenizer, checked as ExecuTorch's runner loads it, before any export work; ``None`` for a tiny
    model, under ``--no-tokenizer``, or (with a warning) where a task that takes ``--no-tokenizer`` finds none."""
    from coreai_partitioner.text_decoder import tokenizer

    if not args.checkpoint or args.no_tokenizer:
        return None
    found = tokenizer.choose(args.checkpoint)
    if found is not None:
        return found
    missing = f"{args.checkpoint} has no tokenizer (tokenizer.json, tokenizer.model, spiece.model, *.tiktoken)"
    if "--no-tokenizer" not in task.FLAGS:
        raise CommandError(f"{missing}; {task.RUNNER} needs one: give the checkpoint its tokenizer")
    warnings.warn(
        f"{missing}; the .pte is exported without one, and {task.RUNNER} will need one (--no-tokenizer says this is meant)",
        stacklevel=2,
    )
    return None


# ---------------------------------------------------------------- export


def load_model(task: Task, plan: Plan, dtype: torch.dtype, *, reference: bool = False) -> torch.nn.Module:
    """The task's model at ``dtype`` (its ``load_model``; ``reference``: ``--verify``'s fp32 one), with transformers'
    own progress bar off where the command shows its own."""
    from transformers.utils import logging as transformers_logging

    if not console.verbose():
        transformers_logging.disable_progress_bar()  # its "Loading weights" bar: the command has its own
    return task.load_model(plan, dtype, reference=reference)


def export(task: Task, plan: Plan, staging: Path) -> None:
    """Load, lower, write the files to ``staging``, verify them; then they go beside ``--out``, and the task's
    companions with them."""
    from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte

    args = plan.args
    phases = Phases()
    verified = model = None
    plan.layer_by_layer = layer_by_layer(task, plan)
    with phases.bar:
        if args.verify:
            with phases("fp32 reference" + (", a module at a time" if plan.layer_by_layer else "")):
                model = load_model(task, plan, torch.float32, reference=True)
                if plan.layer_by_layer:
                    from coreai_partitioner.checkpoints import read_while_running
                    from coreai_partitioner.checkpoints.files import WHOLE_REFERENCE_SHARE

                    logger.info("the fp32 weights are over %d%% of this machine's memory: --verify's reference runs "
                                "a module at a time", 100 * WHOLE_REFERENCE_SHARE)
                    with read_while_running(model):
                        verified = task.reference(plan, model)
                else:
                    verified = task.reference(plan, model)
                if plan.load_dtype != torch.float32 or plan.layer_by_layer:
                    model = None  # the fp32 model goes before the one to export is loaded
        with phases("load"):
            if model is None:
                model = load_model(task, plan, plan.load_dtype)
        lowered, lowered_from = task.lower(plan, model, phases)
        eager = None
        if verified is not None and lowered_from is not None:
            with phases("eager reference"):
                eager = task.eager(plan, lowered, lowered_from, verified)
        del lowered_from
        with phases("write"):
            files = write_lowered(lowered, staging / args.out.name)
            del lowered

    pte = read_pte(files["model"])
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    task.describe(plan, model, pte)
    data = f", .ptd {files['data'].stat().st_size:,} bytes" if "data" in files else ""
    print(f"  .pte {pte.size:,} bytes{data}, weights {weights:,} bytes ({pte.size / weights:.3f}x)")
    for name, path in files.items():
        if name not in ("model", "data"):
            print(f"  adapter {name}: {path.name} {path.stat().st_size:,} bytes")
    print(phases)
    del model
    if verified is not None:
        verify_pte(task, plan, files["model"], verified, eager)
    for name, path in sorted(files.items(), key=lambda item: item[0] == "model"):  # the .pte last: it needs the rest
        path.replace(args.out.with_name(path.name))
    written = task.companions(plan, args.out.parent)
    beside = [args.out.with_name(path.name) for name, path in files.items() if name != "model"] + written
    print(f"wrote {args.out}" + (f" and {', '.join(p.name for p in beside)}" if beside else " (nothing beside it)"))


def write_lowered(lowered: Any, pte: Path) -> dict[str, Path]:
    """Write what a task lowered to ``pte``: its ``.pte`` (``"model"``), the ``.ptd`` (``"data"``) of a program
    lowered with ``external_data``, and one ``NAME.pte`` per adapter of programs over one base (their ``save``)."""
    from coreai_partitioner.lowering.external_data import write_program
    from coreai_partitioner.lowering.lower import to_executorch

    from executorch.exir import EdgeProgramManager

    if not isinstance(lowered, EdgeProgramManager):  # programs over one base: they write themselves
        return lowered.save(pte)
    written = write_program(to_executorch(lowered), pte)
    return {"model": written["pte"], **({"data": written["ptd"]} if "ptd" in written else {})}


def verify_pte(task: Task, plan: Plan, pte: Path, verified: Any, eager: Any) -> None:
    """Print the ``.pte``'s report; a ``.pte`` that falls short of the eager model it was lowered from is not kept."""
    start = time.perf_counter()
    with console.NativeStreams():
        report = task.check(plan, pte, verified, eager)
    print(f"\n{report}\n  ({time.perf_counter() - start:.1f} s)")
    if not report.ok:
        raise CommandError(f"the .pte is not close enough to {report.against}; {plan.args.out} not written")


def main(argv: list[str] | None = None, prog: str = "python -m coreai_partitioner export") -> int:
    """Pick the task, then run its command on the same line (``--task`` taken off it)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    tasks = detect.tasks()
    parser = argparse.ArgumentParser(prog=prog, add_help=False)
    parser.add_argument("--task", choices=sorted(tasks) + sorted(SPEECH_TASKS))
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--config")
    parser.add_argument("-h", "--help", action="store_true")
    known, _ = parser.parse_known_args(argv)
    rest = [a for i, a in enumerate(argv) if a != "--task" and (i == 0 or argv[i - 1] != "--task") and not a.startswith("--task=")]
    if known.task in SPEECH_TASKS:  # Whisper's own words (its generate(task=...)): the decoder prompt's task
        rest += ["--speech-task", known.task]
    try:
        if known.task in tasks:
            task = known.task
        elif known.checkpoint is not None:
            task = detect.checkpoint_task(known.checkpoint)
        elif known.config is not None:
            task = detect.config_task(known.config)
        elif known.help:
            print(__doc__.split("\n\n")[0].strip() + "\n\ntasks: " + ", ".join(tasks) + f"; `{prog} --task TASK --help` shows a task's options")
            return 0
        else:
            task = "text-generation"
    except detect.UnknownTask as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    if task not in tasks:
        print(
            f"{prog}: error: the checkpoint's task is {task}; this package exports {', '.join(tasks)}", file=sys.stderr
        )
        return 1
    if known.task in SPEECH_TASKS and task != "automatic-speech-recognition":
        print(
            f"{prog}: error: --task {known.task} is a speech recognition model's prompt (Whisper's transcribe or "
            f"translate), and this is a {task} export; give --task with one of {', '.join(tasks)}",
            file=sys.stderr,
        )
        return 1
    return run_task(tasks[task], rest, prog=f"{prog} ({task})")
