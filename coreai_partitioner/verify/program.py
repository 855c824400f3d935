"""A ``.pte`` loaded for an app's loop: the methods it calls, a missing one refused by name, its constant methods.

Every task whose ``.pte`` this package runs with a loop of its own (an
encoder-decoder's greedy decoding, text-to-speech, text-to-image) loads it
the same way: :class:`LoadedProgram`, which a task's class names its methods
and its export command to.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


class LoadedProgram:
    """A ``.pte`` loaded in ExecuTorch's runtime, its Core AI delegates on this package's host backend, each method but
    the constant ones loaded once; the program is held as long as its methods run (ExecuTorch's ``Method`` does not
    keep it alive).

    A subclass names the methods its loop needs (``METHODS``) and what to export for a ``.pte`` without them
    (``EXPORT``).
    """

    METHODS: tuple[str, ...] = ()
    EXPORT = "the model with python -m coreai_partitioner export"

    def __init__(self, pte: str | os.PathLike) -> None:
        from coreai_partitioner.backends.apple_coreai.runtime import host

        self.path = Path(pte)
        self.program = host.load_program(self.path)
        names = set(self.program.method_names)
        missing = set(self.METHODS) - names
        if missing:
            raise ValueError(
                f"{self.path}: no method {', '.join(sorted(missing))}; it has {', '.join(sorted(names))}: "
                f"export {self.EXPORT}"
            )
        self.methods = {name: self.program.load_method(name) for name in sorted(names) if not name.startswith("get_")}
        self._constants: dict[str, Any] = {}

    def has(self, method: str) -> bool:
        return method in self.methods

    def constant(self, name: str) -> Any:
        """A constant method's value (read once); a list's values as a tuple (``get_eos_ids``)."""
        if name not in self._constants:
            values = tuple(self.program.load_method(name).execute([]))
            self._constants[name] = values[0] if len(values) == 1 else values
        return self._constants[name]

    def run(self, method: str, *inputs: torch.Tensor) -> list[torch.Tensor]:
        """``method``'s outputs on ``inputs``, each laid out contiguously first (the runtime takes a view's memory as
        it lies)."""
        return list(self.methods[method].execute([tensor.contiguous() for tensor in inputs]))
