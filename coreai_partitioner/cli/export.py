"""``python -m coreai_partitioner export``: one command for every task, picked from the checkpoint's config.

    python -m coreai_partitioner export --checkpoint DIR --out model.pte [--dtype fp16] [--verify] [task options]
    python -m coreai_partitioner export --config NAME --dry-run        # a tiny random model of a family

As ``optimum-cli export`` does, the task comes from the checkpoint's
``config.json`` (:func:`task_of`): its ``architectures``, then its
``model_type``; a checkpoint of another task is refused before any work.
A checkpoint with sentence-transformers' ``modules.json`` beside its config
is ``feature-extraction``, whatever its head (:func:`_checkpoint_task`).
``--task`` names it outright (``--task transcribe`` or ``translate`` is
Whisper's decoder prompt, :data:`SPEECH_TASKS`), and ``--config NAME`` is
the task whose tiny models have that name.  This module is what every task shares: the common
flags (:func:`_flags`, one name each), the plan settled before any weights
are loaded (:class:`Plan`), loading, the export road (load, lower, write
``OUT.partial``, time each phase, print the sizes), the ``--verify`` gate,
and the files written beside the ``.pte``.  A task is a module of
:mod:`.tasks` (:data:`TASKS`) that supplies only what is its own
(:class:`Task`).  ``export-llm``, ``coreai-export-llm`` and
``examples/export_llm.py`` are the ``text-generation`` task
(:func:`export_llm`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol

import torch

from coreai_partitioner import console
from coreai_partitioner.cli.command import CommandError, run_command

#: Each task's module, by task name (optimum's names).
TASKS: dict[str, str] = {
    "text-generation": "coreai_partitioner.cli.tasks.text_generation",
    "image-text-to-text": "coreai_partitioner.cli.tasks.image_text_to_text",
    "automatic-speech-recognition": "coreai_partitioner.cli.tasks.automatic_speech_recognition",
    "fill-mask": "coreai_partitioner.cli.tasks.fill_mask",
    "feature-extraction": "coreai_partitioner.cli.tasks.feature_extraction",
    "image-classification": "coreai_partitioner.cli.tasks.image_classification",
    "text2text-generation": "coreai_partitioner.cli.tasks.text2text_generation",
}

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}

#: ``--task`` values that are not a task this command exports but speech recognition's decoder prompt (Whisper's
#: ``generate(task=...)``): ``--task translate`` exports Whisper to translate, as ``--speech-task translate`` does.
SPEECH_TASKS = ("transcribe", "translate")


def _quantize_help() -> str:
    from coreai_partitioner.quantize import SCHEMES

    # argparse formats help with %: a scheme's "12%" is written %%
    return ("weight-only: " + "; ".join(SCHEMES.values()) + "; composites stay float").replace("%", "%%")


def _flags() -> dict[str, dict[str, Any]]:
    """Every flag two tasks share, by name: the one place each is defined."""
    from coreai_partitioner.backends.apple_coreai import debug_info
    from coreai_partitioner.quantize import SCHEMES

    return {
        "--dtype": dict(choices=tuple(DTYPES), default="fp32", help="the floating dtype the model is exported in"),
        "--target": dict(
            choices=("host", "device"),
            default="host",
            help="host: this package's runtime (caches as delegate state); device: upstream's on-device Core AI "
            "runtime (CoreAIBackend, fp16/fp32 tensors only, caches owned by ExecuTorch)",
        ),
        "--out": dict(type=Path, default=Path("model.pte")),
        "--verify": dict(
            action="store_true",
            help="judge the .pte against the eager model it was lowered from (the fp32 model's distance beside it, "
            "a report) before keeping it",
        ),
        "--dry-run": dict(action="store_true", help="print what would be exported, convert nothing"),
        "--debug-info": dict(
            choices=debug_info.LEVELS,
            default=debug_info.DEFAULT,
            help="what the Core AI asset keeps of the torch source: full = stack traces, for device diagnostics",
        ),
        "--verbose": dict(action="store_true", help="show the dependencies' own logs too"),
        # The flags below are a task's when it names them in its FLAGS.
        "--quantize": dict(choices=tuple(SCHEMES), help=_quantize_help()),
        "--num-layers": dict(type=int, help="the text decoder's first N layers only (fast trials of a big checkpoint)"),
        "--max-context-len": dict(type=int, help="cache length (prompt, images and generated tokens)"),
        "--prefill-chunk": dict(type=int, help="most tokens (or embeddings) one text decoder call takes"),
        "--no-tokenizer": dict(action="store_true", help="export without the checkpoint's tokenizer"),
        "--generate": dict(metavar="PROMPT", help="continue PROMPT from the written .pte through ExecuTorch's runner"),
        "--new-tokens": dict(type=int, default=16, help="how many tokens --generate (and --chat) add"),
        "--max-input-len": dict(
            type=int,
            help="the longest input the encoder takes, in tokens; T runs from 1 to it (default: the most the checkpoint "
            "takes)",
        ),
        "--max-batch": dict(type=int, default=1, help="the most texts one forward call takes"),
    }


#: The flags every task takes; the rest of :func:`_flags`' are a task's when its ``FLAGS`` names them.
COMMON = ("--dtype", "--target", "--out", "--verify", "--dry-run", "--debug-info", "--verbose")

#: A flag's short name.
SHORT = {"--verbose": "-v"}

#: Spellings a flag had in one task's command before there was one command: accepted, not shown.
HIDDEN = {"--prefill-chunk": ("--max-seq-len",), "--max-context-len": ("--max-decode-len",)}


class Task(Protocol):
    """What a task module (:mod:`.tasks`) supplies: only what is its own.

    A module satisfies it with module-level names: ``NAME`` (optimum's task
    name), ``MODEL`` (the ``transformers`` auto class it loads),
    ``RUNNER`` (what runs its ``.pte``, for messages), ``FLAGS`` (the
    shared flags it takes beyond :data:`COMMON`), ``DEFAULTS`` (their
    defaults for it) and these functions.
    """

    NAME: str
    MODEL: str
    RUNNER: str
    FLAGS: tuple[str, ...]
    DEFAULTS: dict[str, Any]

    def tiny_configs(self) -> list[str]:
        """The ``--config`` names: its tiny random models."""

    def tiny_config(self, name: str) -> Any:
        """The config of the tiny random model ``name``.  (A task whose tiny model is not ``MODEL.from_config`` of
        it, seeded, also gives ``tiny_model(config)``: the model in fp32.)"""

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        """Its own flags."""

    def refusals(self) -> tuple[type[Exception], ...]:
        """The errors that refuse its input: printed as one line, no traceback."""

    def settle(self, args: argparse.Namespace, config: Any) -> Plan:
        """Its own checks that need no weights; its :class:`Plan`."""

    def dry_run(self, plan: Plan) -> None:
        """Print what would be exported, from the config alone."""

    def reference(self, plan: Plan, model: torch.nn.Module) -> Any:
        """``--verify``'s reference: the fp32 model's outputs."""

    def lower(self, plan: Plan, model: torch.nn.Module, verified: Any, phases: Phases) -> tuple[Any, Any]:
        """The lowered program (an ``EdgeProgramManager``) and, under ``--verify``, the outputs of the eager model it
        was lowered from (``None``: the reference's)."""

    def describe(self, plan: Plan, model: torch.nn.Module, pte: Any) -> None:
        """Print what the written ``.pte`` holds (``pte`` is :func:`~coreai_partitioner.backends.apple_coreai.runtime.pte.read_pte`'s)."""

    def check(self, plan: Plan, path: Path, verified: Any, eager: Any) -> Any:
        """The ``.pte`` at ``path`` judged: a report with ``ok`` and ``against``."""

    def companions(self, plan: Plan, directory: Path) -> list[Path]:
        """Write what a caller needs beside the ``.pte`` (a tokenizer, a preprocessor's config); the paths written."""

    def after(self, plan: Plan) -> None:
        """Run the written ``.pte`` as its flags ask (``--generate``, ``--chat``, ``--transcribe``)."""


@dataclass
class Plan:
    """What the command will do, settled from its input before any weights are loaded; a task's plan adds its own."""

    args: argparse.Namespace
    config: Any
    tokenizer: Any = None  # decoder.tokenizer.Tokenizer, or None (a tiny model's is made); settled after the task's checks
    runner_tokenizer: bool = True  # ExecuTorch's runner reads the tokenizer (checked first); False: the .pte's caller tokenizes

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.args.dtype]

    @property
    def load_dtype(self) -> torch.dtype:
        """What the weights are loaded in: the export's dtype (a task may load wider and cast parts down)."""
        return self.dtype

    @property
    def generation(self) -> Any:
        """A ``GenerationConfig`` the loaded model carries instead of its own, or ``None``."""
        return None


# ---------------------------------------------------------------- the one command


def build_parser(task: Task, prog: str | None = None) -> argparse.ArgumentParser:
    """The task's command line: the source, the common flags, the shared flags it takes, its own."""
    parser = argparse.ArgumentParser(prog=prog, description=task.__doc__.splitlines()[0], epilog=_examples(task),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", choices=task.tiny_configs(), help="a tiny random model of this family")
    source.add_argument("--checkpoint", type=Path, help="a local Hugging Face checkpoint directory")
    flags = _flags()
    for flag in (*COMMON, *task.FLAGS):
        parser.add_argument(*((SHORT[flag], flag) if flag in SHORT else (flag,)), **flags[flag])
        for alias in HIDDEN.get(flag, ()):  # the old spelling parses; help shows one name
            parser.add_argument(alias, dest=flag.lstrip("-").replace("-", "_"), type=flags[flag].get("type"), help=argparse.SUPPRESS)
    task.add_flags(parser)
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
    return run_task(importlib.import_module(TASKS["text-generation"]), argv, prog)


def run(task: Task, args: argparse.Namespace) -> None:
    """Settle, then (unless ``--dry-run``) export to ``OUT.partial``, verify, keep it as ``--out``, and run it."""
    try:
        plan = settle(task, args)
        if args.dry_run:
            task.dry_run(plan)
            return
        args.out.parent.mkdir(parents=True, exist_ok=True)
        partial = args.out.with_name(args.out.name + ".partial")
        try:
            export(task, plan, partial)
        finally:
            partial.unlink(missing_ok=True)
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
    for flag in ("num_layers", "max_context_len", "prefill_chunk", "new_tokens", "max_input_len", "max_batch"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise CommandError(f"--{flag.replace('_', '-')} {value}: give at least 1")
    plan = task.settle(args, model_config(task, args))
    plan.tokenizer = choose_tokenizer(task, args) if plan.runner_tokenizer else None
    if getattr(args, "generate", None) is not None and args.checkpoint and plan.tokenizer is None:
        raise CommandError("--generate needs a tokenizer, and this export has none")
    return plan


def model_config(task: Task, args: argparse.Namespace) -> Any:
    """``--checkpoint``'s config, or ``--config``'s tiny one."""
    if not args.checkpoint:
        return task.tiny_config(args.config)
    from transformers import AutoConfig

    if not (args.checkpoint / "config.json").is_file():
        what = "no such directory" if not args.checkpoint.is_dir() else "no config.json in it"
        raise CommandError(f"--checkpoint {args.checkpoint}: {what}; give a local Hugging Face checkpoint directory")
    return AutoConfig.from_pretrained(args.checkpoint, local_files_only=True)


def refuse_other_task(name: str, args: argparse.Namespace, config: Any) -> None:
    """Refuse a ``--checkpoint`` whose config (or files beside it: :func:`_task_of_files`) is another task's than
    ``name`` (``--task`` named it), with the command that picks its own."""
    if not args.checkpoint:
        return
    try:
        found = _task_of_files(args.checkpoint) or task_of(config.to_dict(), str(args.checkpoint / "config.json"))
    except UnknownTask as error:
        raise CommandError(str(error)) from None
    if found != name:
        raise CommandError(
            f"--checkpoint {args.checkpoint} is a {found} checkpoint, not {name}; export it with "
            f"`python -m coreai_partitioner export --checkpoint {args.checkpoint}` (which picks its task)"
        )


def checkpoint_generation(checkpoint: Path, config: Any) -> Any:
    """The checkpoint's ``GenerationConfig``, or its model config's where it has no ``generation_config.json``."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(checkpoint, local_files_only=True)
    except OSError:
        return GenerationConfig.from_model_config(config)


def host_form_only(name: str, args: argparse.Namespace) -> None:
    """Refuse ``--target device`` for a task this package exports in the host form only."""
    if args.target != "host":
        raise CommandError(
            f"--target {args.target}: {name} exports the host form only, for this package's runtime (there is no "
            "device form of it); leave out --target"
        )


def first_layers(config: Any, args: argparse.Namespace) -> Any:
    """``config`` cut to its text decoder's first ``--num-layers`` layers (as it is without the flag)."""
    from coreai_partitioner.decoder import first_layers as cut

    if args.num_layers is None:
        return config
    try:
        return cut(config, args.num_layers)
    except ValueError as error:
        raise CommandError(str(error)) from None


def choose_tokenizer(task: Task, args: argparse.Namespace) -> Any:
    """The checkpoint's tokenizer, checked as ExecuTorch's runner loads it, before any export work; ``None`` for a tiny
    model, under ``--no-tokenizer``, or (with a warning) where a task that takes ``--no-tokenizer`` finds none."""
    from coreai_partitioner.decoder import tokenizer

    if not args.checkpoint or getattr(args, "no_tokenizer", False):
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


def tokenizer_beside(plan: Plan) -> Path:
    """The tokenizer file written beside the ``.pte`` (the checkpoint's under its own name, a tiny model's
    ``tokenizer.json``): what ``--generate`` hands the runner."""
    return plan.args.out.parent / (plan.tokenizer.path.name if plan.tokenizer else "tokenizer.json")


def describe_tokenizer(plan: Plan) -> str:
    """The dry run's tokenizer line."""
    if plan.tokenizer is not None:
        return plan.tokenizer.describe()
    return "one character per token (tiny config)" if not plan.args.checkpoint else "none"


# ---------------------------------------------------------------- export


class Phases:
    """The seconds of each phase of an export, and the progress bar that names the phase running (on a terminal)."""

    def __init__(self) -> None:
        from tqdm import tqdm

        self.seconds: dict[str, float] = {}
        self.bar = tqdm(unit="phase", leave=False, disable=None)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.bar.set_description(name)
        start = time.perf_counter()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
        self.bar.update()

    def __str__(self) -> str:
        return "  seconds: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in self.seconds.items())


def load_model(task: Task, plan: Plan, dtype: torch.dtype) -> torch.nn.Module:
    """The checkpoint at ``dtype``; or the tiny config's seeded model, made in fp32 and loaded into one made at ``dtype``
    (what a checkpoint of it loads as), so its fp32 twin (``--verify``'s reference) has the same weights."""
    import transformers
    from transformers.utils import logging as transformers_logging

    if not console.verbose():
        transformers_logging.disable_progress_bar()  # its "Loading weights" bar: the command has its own
    auto = getattr(transformers, task.MODEL)
    if plan.args.checkpoint:
        model = auto.from_pretrained(
            plan.args.checkpoint, config=plan.config, dtype=dtype, local_files_only=True, attn_implementation="eager"
        ).eval()
    else:
        torch.manual_seed(0)
        if hasattr(task, "tiny_model"):  # a task whose random init is not its tiny model's
            model = task.tiny_model(plan.config)
        else:
            model = auto.from_config(plan.config, dtype=torch.float32, attn_implementation="eager").eval()
        if dtype != torch.float32:
            cast = auto.from_config(plan.config, dtype=dtype, attn_implementation="eager").eval()
            cast.load_state_dict(model.state_dict())
            model = cast
    if plan.generation is not None:
        model.generation_config = plan.generation
    return model


def export(task: Task, plan: Plan, partial: Path) -> None:
    """Load, lower, write ``partial``, verify it; then it becomes ``--out``, the task's companions beside it."""
    from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte

    args = plan.args
    phases = Phases()
    verified = model = None
    with phases.bar:
        if args.verify:
            with phases("fp32 reference"):
                model = load_model(task, plan, torch.float32)
                verified = task.reference(plan, model)
                if plan.load_dtype != torch.float32:
                    model = None  # the fp32 model goes before the one to export is loaded
        with phases("load"):
            if model is None:
                model = load_model(task, plan, plan.load_dtype)
        lowered, eager = task.lower(plan, model, verified, phases)
        with phases("write"):
            with open(partial, "wb") as file:
                lowered.to_executorch().write_to_file(file)
            del lowered

    pte = read_pte(partial)
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    task.describe(plan, model, pte)
    print(f"  .pte {pte.size:,} bytes, weights {weights:,} bytes ({pte.size / weights:.3f}x)")
    print(phases)
    del model
    if verified is not None:
        verify_pte(task, plan, partial, verified, eager)
    partial.replace(args.out)
    written = task.companions(plan, args.out.parent)
    print(f"wrote {args.out}" + (f" and {', '.join(p.name for p in written)}" if written else " (nothing beside it)"))


def eager_at_dtype(plan: Plan, verified: Any, forward: Any, phases: Phases) -> Any:
    """Under ``--verify`` at a dtype other than fp32, ``forward`` (the model at it) on the reference's inputs: what a
    ``.pte`` called once must compute (:mod:`coreai_partitioner.verify.forward`); ``None`` otherwise (the fp32
    reference is its eager model's)."""
    if verified is None or plan.dtype == torch.float32:
        return None
    from coreai_partitioner.verify.forward import outputs

    with phases(f"reference ({plan.args.dtype})"):
        return outputs(forward, verified.inputs, plan.dtype)


def verify_pte(task: Task, plan: Plan, pte: Path, verified: Any, eager: Any) -> None:
    """Print the ``.pte``'s report; a ``.pte`` that falls short of the eager model it was lowered from is not kept."""
    start = time.perf_counter()
    with console.NativeStreams():
        report = task.check(plan, pte, verified, eager)
    print(f"\n{report}\n  ({time.perf_counter() - start:.1f} s)")
    if not report.ok:
        raise CommandError(f"the .pte is not close enough to {report.against}; {plan.args.out} not written")


def copy_beside(source: Path, directory: Path) -> Path:
    """``source`` copied into ``directory`` (nothing to do when it is there already); the copy's path."""
    target = directory / source.name
    if source.resolve() != target.resolve():
        target.write_bytes(source.read_bytes())
    return target


# ---------------------------------------------------------------- which task


class UnknownTask(ValueError):
    """A checkpoint whose task this package does not export; names what it found and the tasks it takes."""


#: ``architectures`` suffixes of Hugging Face heads, by the task they are for.
_HEADS = (
    ("ForSpeechSeq2Seq", "automatic-speech-recognition"),
    ("ForImageTextToText", "image-text-to-text"),
    ("ForCausalLM", "text-generation"),
    ("ForMaskedLM", "fill-mask"),
    ("ForImageClassification", "image-classification"),
    ("ForImageClassificationWithTeacher", "image-classification"),
)

#: What :func:`task_of` takes for each task, in an error's words.
_TAKES = {
    "text-generation": "a *ForCausalLM or an LLM family's model_type",
    "image-text-to-text": "a *ForImageTextToText, or a *ForConditionalGeneration with a vision_config, or a VLM family's model_type",
    "automatic-speech-recognition": "Whisper",
    "fill-mask": "a *ForMaskedLM: bert, roberta, distilbert",
    "feature-extraction": "a sentence-transformers checkpoint: modules.json beside config.json",
    "image-classification": "a *ForImageClassification",
    "text2text-generation": "T5 and Flan-T5, a T5ForConditionalGeneration",
}


def _task_of_model_type(model_type: str) -> str | None:
    """The task whose families adapt ``model_type``, or ``None``."""
    from coreai_partitioner.decoder import families as text_families
    from coreai_partitioner.vision import families as vision_families

    if model_type == "whisper":
        return "automatic-speech-recognition"
    if model_type == "t5":
        return "text2text-generation"
    if model_type in vision_families.supported():
        return "image-text-to-text"
    if model_type in text_families.supported():
        return "text-generation"
    return None


def task_of(config: dict[str, Any], where: str = "config.json") -> str:
    """The task of a checkpoint from its ``config.json`` (a dict), as optimum-cli's ``--task auto`` finds it.

    ``architectures`` decides when it names a head (``WhisperForConditionalGeneration`` is speech
    recognition, ``*ForImageTextToText`` and a ``*ForConditionalGeneration`` with a ``vision_config``
    image-text-to-text, a T5's ``*ForConditionalGeneration`` text-to-text generation, ``*ForCausalLM``
    text generation, ``*ForMaskedLM`` fill-mask, ``*ForImageClassification`` image classification);
    otherwise the ``model_type`` does, when a family of this package adapts it.  Anything else
    (``BertModel``) is refused, naming what the config holds and the tasks this command exports.  (A
    sentence-transformers checkpoint is ``feature-extraction`` by its ``modules.json``, a file beside the
    config: :func:`_checkpoint_task`.)
    """
    architectures = config.get("architectures") or []
    model_type = config.get("model_type")
    for architecture in architectures:
        if architecture.startswith("Whisper"):
            return "automatic-speech-recognition"
        if architecture.endswith("ForConditionalGeneration") and "vision_config" in config:
            return "image-text-to-text"
        if architecture.endswith("ForConditionalGeneration") and model_type == "t5":
            return "text2text-generation"
        for suffix, task in _HEADS:
            if architecture.endswith(suffix):
                return task
    if model_type is None and not architectures:
        raise UnknownTask(f"{where} has no model_type and no architectures: give a Hugging Face checkpoint directory")
    task = _task_of_model_type(model_type) if model_type is not None else None
    if task is None:
        found = f"architectures {', '.join(architectures)}" if architectures else "no architectures"
        takes = "; ".join(f"{name} ({what})" for name, what in _TAKES.items())
        raise UnknownTask(
            f"{where} has model_type {model_type!r} and {found}: not a task this command exports, which are {takes}"
            + _bare_encoder(model_type)
        )
    return task


def _task_of_files(checkpoint: Path) -> str | None:
    """The task a checkpoint's files beside ``config.json`` say, or ``None``: sentence-transformers' ``modules.json``
    is ``feature-extraction``, whatever the config's head."""
    return "feature-extraction" if (checkpoint / "modules.json").is_file() else None


def _bare_encoder(model_type: str | None) -> str:
    """How a bare text encoder's checkpoint is exported (a sentence to end the refusal with), or ``""``."""
    from coreai_partitioner.text_encoder import supported

    if model_type not in supported():
        return ""
    return (
        f". A bare {model_type} encoder exports as feature-extraction from a sentence-transformers checkpoint "
        "(modules.json beside config.json says its pooling) or as fill-mask from a *ForMaskedLM checkpoint"
    )


def _checkpoint_task(checkpoint: Path) -> str:
    """The task of a checkpoint directory: what its files beside ``config.json`` say (:func:`_task_of_files`), else
    :func:`task_of` its config."""
    path = checkpoint / "config.json"
    if not path.is_file():
        what = "no such directory" if not checkpoint.is_dir() else "no config.json in it"
        raise UnknownTask(f"--checkpoint {checkpoint}: {what}; give a local Hugging Face checkpoint directory")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UnknownTask(f"{path}: not JSON ({error})") from None
    return _task_of_files(checkpoint) or task_of(config, str(path))


def _config_task(name: str) -> str:
    for task, module in TASKS.items():
        if name in importlib.import_module(module).tiny_configs():
            return task
    names = sorted(n for module in TASKS.values() for n in importlib.import_module(module).tiny_configs())
    raise UnknownTask(f"--config {name}: no tiny config of that name; choose one of {', '.join(names)}")


def main(argv: list[str] | None = None, prog: str = "python -m coreai_partitioner export") -> int:
    """Pick the task, then run its command on the same line (``--task`` taken off it)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog=prog, add_help=False)
    parser.add_argument("--task", choices=sorted(TASKS) + sorted(SPEECH_TASKS))
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--config")
    parser.add_argument("-h", "--help", action="store_true")
    known, _ = parser.parse_known_args(argv)
    rest = [a for i, a in enumerate(argv) if a != "--task" and (i == 0 or argv[i - 1] != "--task") and not a.startswith("--task=")]
    if known.task in SPEECH_TASKS:  # Whisper's own words (its generate(task=...)): the decoder prompt's task
        rest += ["--speech-task", known.task]
    try:
        if known.task in TASKS:
            task = known.task
        elif known.checkpoint is not None:
            task = _checkpoint_task(known.checkpoint)
        elif known.config is not None:
            task = _config_task(known.config)
        elif known.help:
            print(__doc__.split("\n\n")[0].strip() + "\n\ntasks: " + ", ".join(TASKS) + f"; `{prog} --task TASK --help` shows a task's options")
            return 0
        else:
            task = "text-generation"
    except UnknownTask as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    if task not in TASKS:
        print(
            f"{prog}: error: the checkpoint's task is {task}; this package exports {', '.join(TASKS)}", file=sys.stderr
        )
        return 1
    if known.task in SPEECH_TASKS and task != "automatic-speech-recognition":
        print(
            f"{prog}: error: --task {known.task} is a speech recognition model's prompt (Whisper's transcribe or "
            f"translate), and this is a {task} export; give --task with one of {', '.join(TASKS)}",
            file=sys.stderr,
        )
        return 1
    return run_task(importlib.import_module(TASKS[task]), rest, prog=f"{prog} ({task})")
