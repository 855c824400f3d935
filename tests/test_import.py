"""Importing the package changes nothing of its host's: no logger's level, no warning filter, no environment variable.

The dependencies change some at their own import (torch sets its loggers'
levels, numpy and sympy add warning filters, torch's inductor sets
``TORCHINDUCTOR_CACHE_DIR``); that is theirs.  So a fresh process records
who made each change, as the module whose top-level code was running, and
every difference between before and after the imports must come from a
module that is not this package's.  Quieting the dependencies is the
command line's, on its own run (``coreai_partitioner.console.quiet_dependencies``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest


#: What a user imports: the package and its public names, the recipes, the LLM path, verify, console.
USER_IMPORTS = ["coreai_partitioner", "coreai_partitioner.recipes", "coreai_partitioner.text_generation", "coreai_partitioner.verify",
                "coreai_partitioner.console"]
if importlib.util.find_spec("optimum") is not None:
    USER_IMPORTS.append("coreai_partitioner.recipes.optimum")

PROBE = textwrap.dedent(
    """
    import importlib, inspect, json, logging, os, sys, warnings

    def snapshot():
        loggers = {name: logger.level for name, logger in logging.Logger.manager.loggerDict.items()
                   if isinstance(logger, logging.Logger)}
        loggers["<root>"] = logging.root.level
        return {
            "logger level": loggers,
            "warning filter": {repr(entry): True for entry in warnings.filters},
            "environment variable": dict(os.environ),
            "logging.disable": {"": logging.root.manager.disable},
        }

    made = {}  # (kind, key) -> the module whose top-level code made the last change

    def record(kind, key):
        frame = inspect.currentframe().f_back.f_back
        while frame is not None and frame.f_code.co_name != "<module>":
            frame = frame.f_back
        made[(kind, key)] = frame.f_globals.get("__name__", "?") if frame is not None else "?"

    def hook(owner, name, kind, key):
        original = getattr(owner, name)
        def hooked(*args, **kwargs):
            result = original(*args, **kwargs)
            record(kind, key(*args, **kwargs))
            return result
        setattr(owner, name, hooked)

    hook(logging.Logger, "setLevel", "logger level", lambda self, level: "<root>" if self is logging.root else self.name)
    hook(logging, "disable", "logging.disable", lambda *a, **k: "")
    newest = lambda *a, append=False, **k: repr(warnings.filters[-1 if append else 0])
    hook(warnings, "filterwarnings", "warning filter", newest)
    hook(warnings, "simplefilter", "warning filter", newest)
    hook(type(os.environ), "__setitem__", "environment variable", lambda self, key, value: key)
    hook(type(os.environ), "__delitem__", "environment variable", lambda self, key: key)

    before = snapshot()
    for name in sys.argv[1:]:
        module = importlib.import_module(name)
        for public in getattr(module, "__all__", ()):
            getattr(module, public)  # the package's public names load on first use
    after = snapshot()

    changes = []
    for kind in before:
        old, new = before[kind], after[kind]
        for key in sorted(set(old) | set(new)):
            default = logging.NOTSET if kind == "logger level" else None
            if old.get(key, default) != new.get(key, default):
                who = made.get((kind, key), "nobody recorded")
                if who.startswith("coreai_partitioner") or who == "nobody recorded":
                    changes.append(f"{kind} {key!r}: {old.get(key, default)!r} -> {new.get(key, default)!r}, by {who}")
    print(json.dumps(changes))
    """
)


@pytest.mark.slow  # a process importing every dependency
def test_importing_the_package_changes_no_logger_level_warning_filter_or_environment_variable():
    done = subprocess.run([sys.executable, "-c", PROBE, *USER_IMPORTS], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


@pytest.mark.slow
def test_the_command_line_finds_its_tasks_without_importing_executorch():
    """Every command line process finds its tasks first (``detect.tasks()``, building its parser; ``--config NAME``
    asks every task for its tiny configs), before it holds the dependencies' output down: a task module that imported
    ExecuTorch's compiler (which imports torchao, which prints) would print, and cost every command about seven
    seconds here."""
    probe = (
        "import sys; from coreai_partitioner.cli import detect; detect.tasks(); detect.config_task('qwen3'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('executorch', 'torchao')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout
