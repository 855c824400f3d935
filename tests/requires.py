"""A test layer's dependency: skipped where an install leaves it out, a failure under CI (``CI`` set).

A test module that needs an optional dependency calls :func:`require` at
its top.  On a developer's machine without that extra, the module is
skipped with the install command; where the ``CI`` environment variable is
set (CI systems set it; ``.ci/run`` does too) the module fails to collect,
so a broken install cannot turn a whole layer of the suite into skips.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(module: str, extra: str | None = None, *, install: str | None = None) -> ModuleType:
    """``module`` imported; or a skip (locally) or a failure (under CI) naming the extra that installs it, or the
    ``install`` command for a package README's test command installs on its own (``--no-deps``)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        fix = install or f"pip install -e '.[{extra}]' (the test extra has it)"
        message = f"{module} cannot be imported ({error}): {fix}"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI is set, so a missing dependency fails rather than skips", pytrace=False)
        pytest.skip(message, allow_module_level=True)
