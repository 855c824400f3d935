"""What a person running one of this project's commands sees: its own output, not its dependencies'.

Two kinds of noise reach a terminal from the stack this project runs on:

- Python logging and warnings at import and during export: torchao's
  missing CUDA kernels, torch's pytree and ``_check_is_size`` deprecations,
  transformers' advice, coreai-torch's validation notice.
  :func:`quiet_dependencies` turns them off (``verbose_=True`` leaves them);
  the commands call it before they import the dependencies, and a program
  using the library may call it too.  Importing the package does not.
- Native code writing to file descriptors 1 and 2 behind Python's back:
  coreai-core's runtime (``ODIE [default]: Loading function ...``),
  ExecuTorch's C++ ``INFO`` log lines, ``pytorch_tokenizers``' loaders.
  :class:`NativeStreams` takes those descriptors for a while and keeps what
  they wrote (:attr:`NativeStreams.lines`), while Python's own
  ``sys.stdout`` and ``sys.stderr`` keep writing to the terminal.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from typing import Any

#: Environment variable that keeps every dependency's output (``-v`` of this project's commands sets it).
VERBOSE_ENV = "COREAI_PARTITIONER_VERBOSE"

#: Loggers of dependencies that talk at import or export time, and the level they are held to
#: (with ``_compat.PRIVATE_LOGGERS``, the ones named after private modules).
LOGGERS = {
    "torchao": logging.ERROR,
    "torch.export": logging.ERROR,
    "torch.fx.experimental.symbolic_shapes": logging.ERROR,
    "transformers": logging.ERROR,
    "diffusers": logging.ERROR,
    "coreai_torch": logging.WARNING,
    "coremltools": logging.ERROR,
}

#: Warnings of dependencies that are about them, not about the user's model: each names a dependency's message,
#: but for the last, every deprecation, which is held down where a module outside this package warns (:data:`OURS`).
WARNINGS = (
    (FutureWarning, r".*_check_is_size"),
    (FutureWarning, r".*torch_dtype"),
    (FutureWarning, r".*LeafSpec"),
    (UserWarning, r"coreai-torch has only been validated"),
    (UserWarning, r".*TypedStorage is deprecated"),
    # ExecuTorch's emitter on the device form's caches: they carry no initial value on purpose (a call reads
    # only the slots its sequence wrote; text_decoder/device.py), which the warning calls "meaningless initial state".
    (UserWarning, r"Mutation on a buffer in the model is detected"),
    (DeprecationWarning, r".*"),
)

#: The modules whose warnings are this package's own, to the user (a missing tokenizer, a deprecated flag): no
#: filter of :func:`quiet_dependencies` holds them down (the others name dependencies' messages).
OURS = r"coreai_partitioner(\.|$)"


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def quiet_dependencies(verbose_: bool = False) -> None:
    """Hold the dependencies' loggers and warnings down, for the rest of the process; ``verbose_`` keeps them.

    This project's commands call it first thing, before they import anything
    that logs (importing :mod:`coreai_partitioner` changes no logger, warning
    filter or environment variable); a program using the library calls it to
    ask for the same.  With ``verbose_`` (or ``$COREAI_PARTITIONER_VERBOSE=1``)
    nothing is held, and the variable is set for the processes it starts.
    """
    if verbose_ or verbose():
        os.environ[VERBOSE_ENV] = "1"
        return
    from coreai_partitioner import _compat  # torch and coreai-torch only: nothing that logs at import

    for name, level in {**LOGGERS, **_compat.PRIVATE_LOGGERS}.items():
        logging.getLogger(name).setLevel(level)
    others = f"(?!{OURS})"  # filterwarnings matches a module's name from its start
    for category, message in WARNINGS:
        warnings.filterwarnings("ignore", category=category, message=message, module=others if message == ".*" else "")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")  # diffusers sets its root logger's level from it on first use


class NativeStreams:
    """File descriptors 1 and 2 taken from native code while inside; what it wrote is kept.

    Standard error goes to a file, its lines in :attr:`lines` after exit, with
    the lines ExecuTorch's runtime logs through Python's ``sys.stderr``.
    Standard output goes there too, or to ``on_stdout`` (raw bytes, from a
    reader thread, as they come) when given.  Python's ``sys.stdout`` and
    ``sys.stderr`` write to copies of the original descriptors meanwhile, so
    the program's own output and progress bars still reach the terminal.
    """

    def __init__(self, on_stdout: Callable[[bytes], None] | None = None) -> None:
        self._on_stdout = on_stdout
        self.lines: list[str] = []

    def __enter__(self) -> NativeStreams:
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (os.dup(1), os.dup(2))
        self._file = tempfile.TemporaryFile(mode="w+b")
        self._reader = None
        if self._on_stdout is None:
            os.dup2(self._file.fileno(), 1)
        else:
            read, write = os.pipe()
            self._reader = threading.Thread(target=self._read, args=(read,), daemon=True)
            self._reader.start()
            os.dup2(write, 1)
            os.close(write)
        os.dup2(self._file.fileno(), 2)
        self._python = (sys.stdout, sys.stderr)
        self._copies = tuple(
            open(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace") for fd in self._saved
        )
        self._filter = _NativeLogFilter(self._copies[1], self.lines)
        sys.stdout, sys.stderr = self._copies[0], self._filter
        return self

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(4096):
                self._on_stdout(chunk)

    def __exit__(self, *exc_info) -> None:
        self._filter.finish()
        sys.stdout, sys.stderr = self._python
        for copy in self._copies:
            copy.close()
        os.dup2(self._saved[0], 1)  # the pipe's last writer goes: the reader sees its end
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        if self._reader is not None:
            self._reader.join()
        self._file.seek(0)
        native = [line for line in self._file.read().decode(errors="replace").splitlines() if line.strip()]
        self.lines[:0] = native  # before the runtime's log lines, which Python's stream took meanwhile
        self._file.close()

    def tail(self, count: int = 20) -> str:
        """The last ``count`` lines written, for an error message."""
        return "\n".join(self.lines[-count:])


class _NativeLogFilter(io.TextIOBase):
    """Python's ``sys.stderr`` inside :class:`NativeStreams`: the program's own text goes to the terminal, and the
    lines ExecuTorch's runtime logs (its Python bindings write ``[file.cpp:line] message`` to ``sys.stderr``,
    not to file descriptor 2) go to the kept lines instead."""

    _LOG_LINE = re.compile(r"^\[[\w./-]+\.(?:cpp|cc|c|h|hpp|mm):\d+\] ")

    def __init__(self, terminal: Any, lines: list[str]) -> None:
        self._terminal = terminal
        self._lines = lines
        self._pending = ""

    def write(self, text: str) -> int:
        if not self._pending and not text.startswith("["):
            return self._terminal.write(text)  # a progress bar, a warning: as it comes
        self._pending += text
        *complete, self._pending = self._pending.split("\n")
        for line in complete:
            if self._LOG_LINE.match(line):
                self._lines.append(line)
            else:
                self._terminal.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self._terminal.flush()  # a line still being written stays pending: the bindings flush after every piece

    def finish(self) -> None:
        """Hand on what is pending: a log line's start to the kept lines, anything else to the terminal."""
        if self._pending:
            if self._LOG_LINE.match(self._pending):
                self._lines.append(self._pending)
            else:
                self._terminal.write(self._pending)
            self._pending = ""
        self.flush()

    def fileno(self) -> int:
        return self._terminal.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._terminal.encoding

    def isatty(self) -> bool:
        return self._terminal.isatty()
