"""Every private name this project takes from coreai-torch, coreai-core, ExecuTorch and torch.

Keeping them in one folder means the next release of any of those packages
touches it only; ``tests/test_private_names.py`` holds every other module to
it.  A module per package: :mod:`.coreai_internals` (coreai-torch,
coreai-core), :mod:`.executorch_internals`, :mod:`.torch_internals` (and
transformers' two names, T5's position buckets and the weights a model keeps in fp32, and diffusers' one, its
configs' class field); every name is ``_compat.<name>``.  Pinned: torch
2.13.0, executorch 1.5.1, coreai-torch 0.4.3, coreai-core 1.0.0b3.

Importing this package imports torch, coreai-torch and coreai-core, never
ExecuTorch: ExecuTorch imports torchao, which logs at import, and
:func:`coreai_partitioner.console.quiet_dependencies` reads
:data:`PRIVATE_LOGGERS` here before anything logs.  ExecuTorch's names
(``executorch_internals._EXECUTORCH``) are imported on first use.
"""

from __future__ import annotations

import logging
from typing import Any

from coreai_partitioner._compat.coreai_internals import *  # noqa: F401,F403 - first: coreai-torch without its false warning
from coreai_partitioner._compat.executorch_internals import *  # noqa: F401,F403
from coreai_partitioner._compat.torch_internals import *  # noqa: F401,F403
from coreai_partitioner._compat import executorch_internals as _executorch_internals

#: Loggers named after private modules of torch, and the level a command line holds them to
#: (:func:`coreai_partitioner.console.quiet_dependencies`): torch's pytree notices while torchao
#: imports, torch.export's internals while a model exports.
PRIVATE_LOGGERS = {"torch.utils._pytree": logging.ERROR, "torch._export": logging.ERROR}


def __getattr__(name: str) -> Any:
    """One of ExecuTorch's names, imported on first use and kept here."""
    if name not in _executorch_internals._EXECUTORCH:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    found = globals()[name] = _executorch_internals._executorch(name)
    return found
