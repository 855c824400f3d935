"""ExecuTorch's backend test suite (``executorch/backends/test/suite``) on Core AI flows of this package.

torchvision is installed apart from the venv (README's test command:
``pip install --no-deps --target .venv/torchvision``): on the venv's path it
would be found by transformers, whose model imports then fail on our CPU
torch ("operator torchvision::nms does not exist").  What needs it (the
suite's models, :mod:`.models`) runs in a process of its own with
:func:`environment`.
"""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TORCHVISION = TESTS.parent / ".venv" / "torchvision"
INSTALL_TORCHVISION = "pip install --no-deps --target .venv/torchvision torchvision==0.28.0 (README's test command)"


def environment() -> dict[str, str]:
    """This process's environment with the tests folder and torchvision's folder first on ``PYTHONPATH``."""
    paths = [str(TESTS), str(TORCHVISION), os.environ.get("PYTHONPATH", "")]
    return os.environ | {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}
