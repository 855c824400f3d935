"""What every export command does around its own work: one line per warning, one line per error, no traceback.

The export command (:mod:`.export`, a task at a time) builds its parser and
runs; :func:`run_command` quiets the dependencies' output
before the parser imports them, prints this run's warnings one line each
under the command's name, and turns a :class:`CommandError` into exit
status 1 with its one line.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator

from coreai_partitioner import console

__all__ = ["CommandError", "one_line_warnings", "run_command"]


class CommandError(Exception):
    """Bad input or a failed check: one line for the user, no traceback."""


def run_command(
    build_parser: Callable[[str | None], argparse.ArgumentParser],
    run: Callable[[argparse.Namespace], None],
    argv: list[str] | None = None,
    prog: str | None = None,
) -> int:
    """Parse ``argv`` (``sys.argv[1:]`` by default) with ``build_parser(prog)`` and ``run`` it; returns the exit
    status (``-v``/``--verbose`` leaves the dependencies' own output on)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    console.quiet_dependencies(any(a in ("-v", "--verbose") for a in argv))  # before the parser imports them
    parser = build_parser(prog)
    with one_line_warnings(parser.prog):  # the parser's too: an old spelling of a flag warns
        args = parser.parse_args(argv)
        try:
            run(args)
        except CommandError as error:
            parser.exit(1, f"{parser.prog}: error: {error}\n")
    return 0


@contextmanager
def one_line_warnings(prog: str) -> Iterator[None]:
    """Inside, a warning is one line on standard error under the command's name ``prog``."""

    def one_line(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"{prog}: warning: {message}", file=sys.stderr if file is None else file)

    shown, warnings.showwarning = warnings.showwarning, one_line
    try:
        yield
    finally:
        warnings.showwarning = shown
