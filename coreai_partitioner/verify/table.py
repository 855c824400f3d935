"""The project's one style of plain-text table (``tabulate``'s, as ExecuTorch's own tools print them), and a report of outputs as one.

:class:`OutputsReport` is the base of :class:`.report.Report` (element by element) and
:class:`.fidelity.SignalReport` (by SNR): a row per output and a verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from tabulate import tabulate


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain-text table in the project's one style."""
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


@dataclass(frozen=True)
class OutputsReport:
    """A program's outputs against a reference, one table row each, and a verdict.

    A subclass says what an output's row holds (:attr:`headers`, :meth:`row`)
    and what :meth:`raise_for_mismatch` says when the program falls short.
    """

    outputs: tuple
    note: str = ""

    headers: ClassVar[tuple[str, ...]] = ()
    falls_short: ClassVar[str] = "lowered program does not match its reference"

    @property
    def ok(self) -> bool:
        return not self.note and all(o.ok for o in self.outputs)

    def row(self, output: Any) -> list[Any]:
        raise NotImplementedError

    def notes(self) -> list[str]:
        """Lines printed under the table, before the verdict."""
        return [self.note] if self.note else []

    def __str__(self) -> str:
        lines = [table([self.row(o) for o in self.outputs], list(self.headers)), *self.notes()]
        lines.append("ok" if self.ok else "NOT OK")
        return "\n".join(lines)

    def raise_for_mismatch(self) -> None:
        """Raise ``AssertionError`` with the table when an output falls short."""
        if not self.ok:
            raise AssertionError(f"{self.falls_short}:\n{self}")
