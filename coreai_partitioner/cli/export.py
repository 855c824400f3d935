"""``python -m coreai_partitioner export``: one command for every task, picked from the checkpoint's config.

    python -m coreai_partitioner export --checkpoint DIR --out model.pte [task options]

As ``optimum-cli export`` does, the task comes from the checkpoint's
``config.json`` (:func:`task_of`): its ``architectures``, then its
``model_type``; a checkpoint of another task is refused before any work.  Each task's own command parses the rest of the line
(:data:`TASKS`): ``text-generation`` is ``export-llm``, ``image-text-to-text``
:mod:`~coreai_partitioner.cli.export_vlm`, ``automatic-speech-recognition``
:mod:`~coreai_partitioner.cli.export_asr`.  ``--task`` names the
task outright; ``--config NAME`` (a tiny random model) is the task whose
command knows that name.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

#: Each task's command module, by task name (optimum's names).  A module has ``main(argv, prog)`` and
#: ``tiny_configs()``, the ``--config`` names it builds.
TASKS: dict[str, str] = {
    "text-generation": "coreai_partitioner.cli.export_llm",
    "image-text-to-text": "coreai_partitioner.cli.export_vlm",
    "automatic-speech-recognition": "coreai_partitioner.cli.export_asr",
}

#: ``architectures`` suffixes of Hugging Face heads, by the task they are for.
_HEADS = (
    ("ForSpeechSeq2Seq", "automatic-speech-recognition"),
    ("ForImageTextToText", "image-text-to-text"),
    ("ForCausalLM", "text-generation"),
)

#: What :func:`task_of` takes for each task, in an error's words.
_TAKES = {
    "text-generation": "a *ForCausalLM or an LLM family's model_type",
    "image-text-to-text": "a *ForImageTextToText, or a *ForConditionalGeneration with a vision_config, or a VLM family's model_type",
    "automatic-speech-recognition": "Whisper",
}


class UnknownTask(ValueError):
    """A checkpoint whose task this package does not export; names what it found and the tasks it takes."""


def _task_of_model_type(model_type: str) -> str | None:
    """The task whose families adapt ``model_type``, or ``None``."""
    from coreai_partitioner.llm import families as llm_families
    from coreai_partitioner.vision import families as vision_families

    if model_type == "whisper":
        return "automatic-speech-recognition"
    if model_type in vision_families.supported():
        return "image-text-to-text"
    if model_type in llm_families.supported():
        return "text-generation"
    return None


def task_of(config: dict[str, Any], where: str = "config.json") -> str:
    """The task of a checkpoint from its ``config.json`` (a dict), as optimum-cli's ``--task auto`` finds it.

    ``architectures`` decides when it names a head (``WhisperForConditionalGeneration`` is speech
    recognition, ``*ForImageTextToText`` and a ``*ForConditionalGeneration`` with a ``vision_config``
    image-text-to-text, ``*ForCausalLM`` text generation); otherwise the ``model_type`` does, when a
    family of this package adapts it.  Anything else (``BertModel``) is refused, naming what the config
    holds and the tasks this command exports.
    """
    architectures = config.get("architectures") or []
    model_type = config.get("model_type")
    for architecture in architectures:
        if architecture.startswith("Whisper"):
            return "automatic-speech-recognition"
        if architecture.endswith("ForConditionalGeneration") and "vision_config" in config:
            return "image-text-to-text"
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
        )
    return task


def _checkpoint_task(checkpoint: Path) -> str:
    path = checkpoint / "config.json"
    if not path.is_file():
        what = "no such directory" if not checkpoint.is_dir() else "no config.json in it"
        raise UnknownTask(f"--checkpoint {checkpoint}: {what}; give a local Hugging Face checkpoint directory")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UnknownTask(f"{path}: not JSON ({error})") from None
    return task_of(config, str(path))


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
    parser.add_argument("--task", choices=sorted(TASKS))
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--config")
    parser.add_argument("-h", "--help", action="store_true")
    known, _ = parser.parse_known_args(argv)
    rest = [a for i, a in enumerate(argv) if a != "--task" and (i == 0 or argv[i - 1] != "--task") and not a.startswith("--task=")]
    try:
        if known.task:
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
    return importlib.import_module(TASKS[task]).main(rest, prog=f"{prog} ({task})")
