"""One file per text-to-speech family, found by its ``NAME`` (the ``--config`` name and what the ``.pte`` says it is).

A family module defines:

- ``NAME``: its name: the tiny model's ``--config`` name, and what :attr:`~..program.SpeechProgram.family` says;
- ``CODE``: what its program's ``get_family`` constant method returns (an int no other family uses);
- ``MODEL_TYPES``, ``HEADS``: the ``config.model_type`` values and ``architectures`` heads of its checkpoints;
- ``TAKES``: what it takes, in an error's words; ``TITLE``: its name in the command's lines;
- ``LIMITS``: ``(max_tokens, max_frames)`` where the flags do not give them;
- ``ID_FILES``: the checkpoint's files an app makes ids with, copied beside the ``.pte``;
- ``AGAINST``: what ``--verify`` judges its ``.pte`` against, in the report's words;
- ``Unsupported``: the error that refuses its input (printed as one line);
- ``is_checkpoint(directory) -> bool``: a directory that is its checkpoint by its files, whatever its config
  says (``None`` where ``config.json`` says it);
- ``load_config(checkpoint)``, ``load_model(checkpoint, config, dtype)``, ``tiny_config()``, ``tiny_model(config)``;
- ``limits(config, max_tokens, max_frames) -> (max_tokens, max_frames)``: the flags checked against the config, a
  default for each not given (``None``), before any weights are loaded;
- ``layers(config) -> str`` and ``methods(config, max_tokens, max_frames) -> list[str]``: the dry run's lines;
- ``seeded_reference(model, config, max_tokens) -> SpeechReference``: ``--verify``'s seeded random ids through the model;
- ``lower(model, *, max_tokens, max_frames, device, **partitioner_options)``: its two methods lowered;
- ``replay(program, reference) -> (durations, waveform)``: the reference's ids through the ``.pte``;
- ``speak(program, ids, *, voice, speed, seed) -> waveform``: ``generate-speech``'s loop (refusing a voice or a
  speed it does not take).

Adding a family is adding its file here, or (from outside the package) :func:`register`.
Modules whose name starts with ``_`` are not families.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from types import ModuleType
from typing import Any


class UnknownFamily(ValueError):
    """A config or program no text-to-speech family takes; names what it found and the families."""


@functools.cache
def registry() -> dict[str, ModuleType]:
    """``NAME`` -> its family module: the modules of this package, then what :func:`register` added."""
    families: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            module = importlib.import_module(f"{__name__}.{info.name}")
            families[module.NAME] = module
    return families


def register(module: ModuleType) -> None:
    """Add a family module defined outside this package (the module docstring says what it defines)."""
    taken = {family.CODE: name for name, family in registry().items() if name != module.NAME}
    if module.CODE in taken:
        raise ValueError(f"text-to-speech family {module.NAME!r}: CODE {module.CODE} is {taken[module.CODE]!r}'s; pick another")
    registry()[module.NAME] = module


def unregister(name: str) -> None:
    """Remove a family :func:`register` added."""
    registry().pop(name, None)


def names() -> list[str]:
    """Every family's ``NAME``, in registry order: the tiny ``--config`` names."""
    return list(registry())


def model_types() -> list[str]:
    """Every ``config.model_type`` some family takes."""
    return [model_type for family in registry().values() for model_type in family.MODEL_TYPES]


def family_named(name: str) -> ModuleType:
    family = registry().get(name)
    if family is None:
        raise UnknownFamily(f"no text-to-speech family {name!r}; families: {', '.join(registry())}")
    return family


def family_of(config: Any) -> ModuleType:
    """The family whose ``MODEL_TYPES`` has ``config.model_type``."""
    model_type = getattr(config, "model_type", None)
    for family in registry().values():
        if model_type in family.MODEL_TYPES:
            return family
    raise UnknownFamily(f"model_type {model_type!r}: no text-to-speech family takes it; families: {', '.join(model_types())}")


def family_of_code(code: int) -> ModuleType | None:
    """The family whose program's ``get_family`` says ``code``, or ``None``."""
    return next((family for family in registry().values() if family.CODE == code), None)


def family_of_directory(checkpoint: Any) -> ModuleType | None:
    """The family whose ``is_checkpoint`` takes the directory ``checkpoint`` by its files, or ``None``."""
    return next((f for f in registry().values() if f.is_checkpoint is not None and f.is_checkpoint(checkpoint)), None)
