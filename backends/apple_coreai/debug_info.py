"""How much debug information the Core AI asset keeps: the ``debug_info`` option.

coreai-torch records, on every op of the program it converts, the torch
stack trace that made it: absolute source paths of the build machine
(the working directory included) and per-node metadata.  That is about 25 kB
of a tiny decoder's 480 kB asset, and it makes two builds of one model in two
directories differ.  ExecuTorch keeps debug information out of the ``.pte``
(an ETRecord is asked for), and so does this backend unless told otherwise:

* ``"none"`` (default): no location or metadata on any op;
* ``"op_ids"``: a sequential operation ID on every op, as coreai-torch's
  ``strip_debug_info`` leaves it;
* ``"full"``: coreai-torch's stack traces, for mapping device diagnostics and
  profiles back to the PyTorch source.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a command line reads LEVELS before it imports ExecuTorch's compiler (which prints)
    from executorch.exir.backend.compile_spec_schema import CompileSpec

from .asset import strip_debug_info

LEVELS = ("none", "op_ids", "full")
DEFAULT = "none"
COMPILE_SPEC_KEY = "coreai_debug_info"


def compile_specs(level: str) -> list[CompileSpec]:
    """The compile spec that asks for ``level`` (none for the default)."""
    _check(level, "debug_info")
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    return [] if level == DEFAULT else [CompileSpec(COMPILE_SPEC_KEY, level.encode())]


def requested(specs: list[CompileSpec]) -> str:
    """The level a delegate's compile specs ask for."""
    level = next((spec.value.decode() for spec in specs if spec.key == COMPILE_SPEC_KEY), DEFAULT)
    _check(level, f"compile spec {COMPILE_SPEC_KEY}")
    return level


def _check(level: str, where: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"{where}={level!r} is not one of {', '.join(map(repr, LEVELS))}")


def keep_only(program: Any, level: str) -> None:
    """Strip ``program``'s op locations down to ``level``, in place."""
    if level != "full":
        strip_debug_info(program, keep_op_ids=level == "op_ids")
