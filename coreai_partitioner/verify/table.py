"""The project's one style of plain-text table: ``tabulate``'s, as ExecuTorch's own tools print them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tabulate import tabulate


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain-text table in the project's one style."""
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)
