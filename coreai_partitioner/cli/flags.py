"""Every flag more than one command or task takes, defined once here, one meaning per name.

:data:`_DEFINITIONS` is the one place a shared flag is written (its name,
type, default and help: a new shared flag is a line there); the export command (:mod:`.export`) adds the
:data:`COMMON` ones to every task and the rest a task's ``FLAGS`` names, and
``export-optimum`` (:mod:`.main`) takes ``--dtype`` and ``--max-context-len``
from here too.  A name means one thing in every command:

- ``--dtype`` is ``fp32`` or ``fp16``;
- ``--max-context-len`` is the cache length (prompt, images and generated tokens);
- ``--prefill-chunk`` is the most tokens one call takes (ExecuTorch's ``get_max_seq_len``).

A spelling a command had before (:data:`DEPRECATED`, :data:`OPTIMUM_DEPRECATED`,
``--dtype float16``) still parses, to the flag it meant there, hidden from
``--help`` and with a ``FutureWarning`` naming the flag to give instead.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

#: ``--dtype``'s values.
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}

#: ``--dtype`` values ``export-optimum`` took before it took :data:`DTYPES`' names.
DTYPE_SPELLINGS = {"float32": "fp32", "float16": "fp16"}


def _quantize() -> dict[str, Any]:
    from coreai_partitioner.quantize import SCHEMES

    # argparse formats help with %: a scheme's "12%" is written %%
    schemes = ("weight-only: " + "; ".join(SCHEMES.values()) + "; composites stay float").replace("%", "%%")
    return dict(choices=tuple(SCHEMES), help=schemes)


def _debug_info() -> dict[str, Any]:
    from coreai_partitioner.backends.apple_coreai import debug_info

    return dict(
        choices=debug_info.LEVELS,
        default=debug_info.DEFAULT,
        help="what the Core AI asset keeps of the torch source: full = stack traces, for device diagnostics",
    )


#: Every shared flag, by name: ``add_argument``'s keywords, or a function giving them where they come from a module
#: that is slow to import (read only when a parser takes the flag).
_DEFINITIONS: dict[str, dict[str, Any] | Callable[[], dict[str, Any]]] = {
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
    "--external-data": dict(
        action="store_true",
        help="put the weights in OUT.ptd beside the .pte, which keeps the graphs (ExecuTorch's program-data "
        "separation: load the pair with data_path=)",
    ),
    "--debug-info": _debug_info,
    "--verbose": dict(action="store_true", help="show the dependencies' own logs too"),
    # The flags below are a task's when it names them in its FLAGS.
    "--quantize": _quantize,
    "--num-layers": dict(type=int, help="the text decoder's first N layers only (fast trials of a big checkpoint)"),
    "--max-context-len": dict(type=int, help="cache length (prompt, images and generated tokens)"),
    "--prefill-chunk": dict(type=int, help="most tokens (or embeddings) one text decoder call takes"),
    "--no-tokenizer": dict(action="store_true", help="export without the checkpoint's tokenizer"),
    "--generate": dict(metavar="PROMPT", help="continue PROMPT from the written .pte through ExecuTorch's runner"),
    "--new-tokens": dict(type=int, default=16, help="how many tokens --generate (and --chat) add"),
    "--max-input-len": dict(
        type=int,
        help="the longest input the encoder takes, in tokens; T runs from 1 to it (default: the most the checkpoint takes)",
    ),
    "--max-batch": dict(type=int, default=1, help="the most texts one forward call takes"),
}


#: Every shared flag's name.
NAMES = tuple(_DEFINITIONS)


def dest(flag: str) -> str:
    """The attribute a flag parses to (``--max-context-len``: ``max_context_len``)."""
    return flag.lstrip("-").replace("-", "_")


def definition(flag: str) -> dict[str, Any]:
    """``add_argument``'s keywords for the shared flag ``flag``."""
    keywords = _DEFINITIONS[flag]
    return keywords() if callable(keywords) else dict(keywords)


def definitions() -> dict[str, dict[str, Any]]:
    """Every shared flag, by name: ``add_argument``'s keywords."""
    return {flag: definition(flag) for flag in _DEFINITIONS}


#: The flags every task of the export command takes; the rest of :func:`definitions`' are a task's when its
#: ``FLAGS`` names them.
COMMON = ("--dtype", "--target", "--out", "--verify", "--dry-run", "--external-data", "--debug-info", "--verbose")

#: A flag's short name.
SHORT = {"--verbose": "-v"}

#: The export command's old spellings of a flag (one task's command had them before there was one command).
DEPRECATED = {"--prefill-chunk": ("--max-seq-len",), "--max-context-len": ("--max-decode-len",)}

#: ``export-optimum``'s: its ``--max-seq-len`` was the cache length.
OPTIMUM_DEPRECATED = {"--max-context-len": ("--max-seq-len",)}


class _OldSpelling(argparse.Action):
    """An old spelling of ``flag``: parses to the same destination, with a ``FutureWarning`` naming ``flag``."""

    def __init__(self, option_strings: list[str], dest: str, flag: str = "", **kwargs: Any) -> None:
        self.flag = flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        warnings.warn(f"{option_string} is deprecated: give {self.flag} (the same value)", FutureWarning)
        setattr(namespace, self.dest, values)


def old_dtype(value: str) -> str:
    """``--dtype``'s value, an old spelling (``float16``) taken with a ``FutureWarning``."""
    if value in DTYPE_SPELLINGS:
        warnings.warn(f"--dtype {value} is deprecated: give --dtype {DTYPE_SPELLINGS[value]}", FutureWarning)
        return DTYPE_SPELLINGS[value]
    return value


def add(parser: argparse.ArgumentParser, names: tuple[str, ...], deprecated: dict[str, tuple[str, ...]] = DEPRECATED,
        **overrides: dict[str, Any]) -> None:
    """Add the shared flags ``names`` to ``parser`` and their ``deprecated`` spellings (parsed, not shown); a flag's
    keywords may be overridden by its ``dest`` (``max_context_len=dict(default=2048)``)."""
    for flag in names:
        keywords = {**definition(flag), **overrides.get(dest(flag), {})}
        parser.add_argument(*((SHORT[flag], flag) if flag in SHORT else (flag,)), **keywords)
        for old in deprecated.get(flag, ()):
            parser.add_argument(old, dest=dest(flag), type=keywords.get("type"), action=_OldSpelling, flag=flag, help=argparse.SUPPRESS)
