"""Which task a checkpoint is, from what each task module declares: the export command's one registry of tasks.

Every module of :mod:`coreai_partitioner.cli.tasks` is a task (:func:`tasks`,
by its ``NAME``), and says how its checkpoints are recognised in its
``DETECT`` (:class:`Detection`): the files beside ``config.json`` that decide
whatever the config says (sentence-transformers' ``modules.json``), the
``architectures`` heads it takes (:class:`Head`), the ``model_type`` values
its families adapt, and what it takes in an error's words.  As optimum-cli's
``--task auto``: files first, then ``architectures``, then ``model_type``
(:func:`task_of`, :func:`checkpoint_task`); a tiny ``--config NAME`` is the
task whose ``tiny_configs()`` has it (:func:`config_task`).  Adding a task is
adding its module; nothing here names one.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from coreai_partitioner.cli.checkpoint import UnknownTask, config_file
from coreai_partitioner.cli.command import CommandError

__all__ = [
    "Detection", "Head", "UnknownTask", "checkpoint_task", "config_file", "config_task", "refuse_other_task", "task_of", "tasks",
]


@dataclass(frozen=True)
class Head:
    """An ``architectures`` entry that names a task: it ends in ``suffix`` and starts with ``prefix``, in a config of
    ``model_type`` that holds the key ``key`` and not ``absent``, where each is given."""

    suffix: str = ""
    prefix: str = ""
    model_type: str | None = None
    key: str | None = None
    absent: str | None = None

    def matches(self, architecture: str, config: dict[str, Any]) -> bool:
        return (
            architecture.endswith(self.suffix)
            and architecture.startswith(self.prefix)
            and (self.model_type is None or config.get("model_type") == self.model_type)
            and (self.key is None or self.key in config)
            and (self.absent is None or self.absent not in config)
        )

    @property
    def conditions(self) -> int:
        """How much beyond its suffix it asks: of two heads an architecture matches, the one that asks more decides
        (``WhisperForCausalLM`` is Whisper's, not any causal LM's)."""
        return sum(bool(c) for c in (self.prefix, self.model_type, self.key, self.absent))


@dataclass(frozen=True)
class Detection:
    """How a task module's checkpoints are recognised (its ``DETECT``)."""

    takes: str  # what it takes, in an error's words: "a *ForMaskedLM: bert, roberta, distilbert"
    heads: tuple[Head, ...] = ()
    model_types: Iterable[str] | Callable[[], Iterable[str]] = ()  # its families' model types (a function: read late)
    files: tuple[str, ...] = ()  # a file of these beside config.json makes a checkpoint this task's, whatever its head
    # Whether a directory is this task's by what its files hold (Kokoro's config.json has no model_type): reads
    # them, imports nothing heavy.
    directory: Callable[[Path], bool] | None = None
    refusal_hint: Callable[[str | None], str] | None = None  # a sentence ending the refusal of a model type it knows
    # Refuses (raises) another task's config in the task's own words, before the command's refusal says its task.
    own_refusal: Callable[[Any], None] | None = None

    def adapts(self, model_type: str) -> bool:
        types = self.model_types() if callable(self.model_types) else self.model_types
        return model_type in types


@functools.cache
def tasks() -> dict[str, Any]:
    """Every task module of :mod:`coreai_partitioner.cli.tasks`, by its ``NAME``, in the order of their files, each
    with the default of every optional hook it leaves out (:func:`~.task.with_defaults`)."""
    from coreai_partitioner.cli import tasks as package
    from coreai_partitioner.cli.task import with_defaults

    found = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
        module = with_defaults(importlib.import_module(f"{package.__name__}.{info.name}"))
        found[module.NAME] = module
    return found


def task_of(config: dict[str, Any], where: str = "config.json") -> str:
    """The task of a checkpoint from its ``config.json`` (a dict), as optimum-cli's ``--task auto`` finds it.

    ``architectures`` decides when an entry is a head a task declares (the head asking most of the config wins:
    ``WhisperForConditionalGeneration`` is speech recognition, a ``*ForConditionalGeneration`` with a
    ``vision_config`` image-text-to-text, a T5's text-to-text generation, ``*ForCausalLM`` text generation...);
    otherwise the ``model_type`` does, when a task's family adapts it.  Anything else (``BertModel``) is refused,
    naming what the config holds and the tasks this command exports.  (Files beside the config decide before it:
    :func:`checkpoint_task`.)
    """
    architectures = config.get("architectures") or []
    model_type = config.get("model_type")
    for architecture in architectures:
        found = [(head.conditions, name) for name, task in tasks().items() for head in task.DETECT.heads if head.matches(architecture, config)]
        if found:
            return max(found, key=lambda match: match[0])[1]
    if model_type is None and not architectures:
        raise UnknownTask(f"{where} has no model_type and no architectures: give a Hugging Face checkpoint directory")
    for name, task in tasks().items():
        if model_type is not None and task.DETECT.adapts(model_type):
            return name
    found = f"architectures {', '.join(architectures)}" if architectures else "no architectures"
    takes = "; ".join(f"{name} ({task.DETECT.takes})" for name, task in tasks().items())
    hints = "".join(task.DETECT.refusal_hint(model_type) for task in tasks().values() if task.DETECT.refusal_hint)
    raise UnknownTask(f"{where} has model_type {model_type!r} and {found}: not a task this command exports, which are {takes}{hints}")


def task_of_files(checkpoint: Path) -> str | None:
    """The task the files of a checkpoint directory say (a task's ``DETECT.files``), or ``None``."""
    for name, task in tasks().items():
        if any((checkpoint / file).is_file() for file in task.DETECT.files):
            return name
        if task.DETECT.directory is not None and task.DETECT.directory(checkpoint):
            return name
    return None


def checkpoint_task(checkpoint: Path) -> str:
    """The task of a checkpoint directory: what its files say (:func:`task_of_files`: a diffusers pipeline's
    ``model_index.json`` has no ``config.json`` beside it), else :func:`task_of` its ``config.json``."""
    by_files = task_of_files(checkpoint) if checkpoint.is_dir() else None
    if by_files:
        return by_files
    path = config_file(checkpoint)
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UnknownTask(f"{path}: not JSON ({error})") from None
    return task_of(config, str(path))


def config_task(name: str) -> str:
    """The task whose tiny random models (``tiny_configs()``) have the name ``name``."""
    for task, module in tasks().items():
        if name in module.tiny_configs():
            return task
    names = sorted(n for module in tasks().values() for n in module.tiny_configs())
    raise UnknownTask(f"--config {name}: no tiny config of that name; choose one of {', '.join(names)}")


def refuse_other_task(name: str, args: argparse.Namespace, config: Any) -> None:
    """Refuse a ``--checkpoint`` whose files or config are another task's than ``name`` (``--task`` or the command
    named it): in the task's own words where it has them (``DETECT.own_refusal``), else with the command that picks
    its own."""
    if not args.checkpoint:
        return
    try:
        found = task_of_files(args.checkpoint) or task_of(config.to_dict(), str(args.checkpoint / "config.json"))
    except UnknownTask as error:
        raise CommandError(str(error)) from None
    if found != name:
        if tasks()[name].DETECT.own_refusal is not None:
            tasks()[name].DETECT.own_refusal(config)
        raise CommandError(
            f"--checkpoint {args.checkpoint} is a {found} checkpoint, not {name}; export it with "
            f"`python -m coreai_partitioner export --checkpoint {args.checkpoint}` (which picks its task)"
        )
