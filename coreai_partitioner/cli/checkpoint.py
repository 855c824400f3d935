"""A checkpoint directory's ``config.json``: found (a directory that is something else refused, naming what it is)
and read as transformers reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coreai_partitioner.cli.command import CommandError


class UnknownTask(ValueError):
    """A checkpoint whose task this package does not export; names what it found and the tasks it takes."""


def config_file(checkpoint: Path) -> Path:
    """``checkpoint``'s ``config.json``; refused naming what the directory is instead (none, a PEFT adapter)."""
    path = checkpoint / "config.json"
    if (checkpoint / "adapter_config.json").is_file() and not path.is_file():
        raise UnknownTask(
            f"--checkpoint {checkpoint} is a PEFT adapter, not a model: give its base model as --checkpoint and "
            f"the adapter as --adapter {checkpoint} (text-generation)"
        )
    if not path.is_file():
        what = "no such directory" if not checkpoint.is_dir() else "no config.json in it"
        raise UnknownTask(f"--checkpoint {checkpoint}: {what}; give a local Hugging Face checkpoint directory")
    return path


def transformers_config(checkpoint: Path) -> Any:
    """``checkpoint``'s config as transformers reads it (a task's default ``load_config``); a directory without a
    ``config.json`` refused naming what it is."""
    from transformers import AutoConfig

    try:
        config_file(checkpoint)
    except UnknownTask as error:
        raise CommandError(str(error)) from None
    return AutoConfig.from_pretrained(checkpoint, local_files_only=True)
