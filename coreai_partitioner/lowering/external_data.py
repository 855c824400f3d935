"""Program-data separation: a ``.pte`` of graphs and a ``.ptd`` of weights, as ExecuTorch 1.5.1 writes them.

A program lowered with ``external_data=True`` has every Core AI asset in
named data tagged :data:`DATA_TAG` (the backend's ``deliver_inline``), and
:func:`executorch_config` sends each constant left outside the delegates to
the same tag.  ExecuTorch serializes everything so tagged into one data file;
:func:`write_program` writes the ``.pte`` and that file, named after the
``.pte`` (``model.pte`` and ``model.ptd``), each through a temporary file
renamed into place.  ExecuTorch's ``Runtime.load_program(pte,
data_path=ptd)``, ``TextLLMRunner(pte, tokenizer, data_path=ptd)`` and
``MultimodalRunner`` load the pair; the runtime's named data map holds both
files' entries under their keys, so a backend finds its asset wherever it is.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from executorch.exir import ExecutorchBackendConfig

from coreai_partitioner import _compat
from coreai_partitioner.backends.apple_coreai.deliver import DATA_TAG


def data_path(pte: str | os.PathLike) -> Path:
    """The data file beside ``pte``: ``model.pte`` -> ``model.ptd``."""
    return Path(pte).with_suffix(".ptd")


def external_data_tags(edge: Any) -> set[str]:
    """The data-file tags the Core AI delegates of ``edge`` (an ``EdgeProgramManager``) were lowered with."""
    from coreai_partitioner.backends.apple_coreai.deliver import external_data_tag
    from coreai_partitioner.lowering.device import lowered_modules

    tags = {external_data_tag(module.compile_specs) for _, module in lowered_modules(edge)}
    return {tag for tag in tags if tag is not None}


def constants_to(tag: str, kept: Collection[str] = ()) -> Callable[[Any], str | None]:
    """``ExecutorchBackendConfig.external_constants``: every constant placeholder to ``tag``, except ``kept``
    (placeholder names or constant targets, which stay in the ``.pte``)."""
    kept = frozenset(kept)

    def tag_of(node: Any) -> str | None:
        return None if node.name in kept or node.target in kept else tag

    return tag_of


def executorch_config(
    config: ExecutorchBackendConfig | None = None, *, tag: str = DATA_TAG, kept: Collection[str] = ()
) -> ExecutorchBackendConfig:
    """``config`` (ExecuTorch's default when None) with the constants outside the delegates sent to ``tag``."""
    config = config if config is not None else ExecutorchBackendConfig()
    config.external_constants = constants_to(tag, kept)
    return config


def write_program(program: Any, pte: str | os.PathLike, *, with_data: bool = True) -> dict[str, Path]:
    """Write ``program`` (an ``ExecutorchProgramManager``) to ``pte``, and its data file, if it has one, beside it.

    ``with_data=False`` writes the ``.pte`` alone, for a program that runs
    with another program's data file (an adapter's, with its base's).

    Each file is written to a temporary file in its directory and renamed
    into place only once both are complete, so a failure leaves neither
    half-written.  A program with data for more than one file is refused:
    ExecuTorch's runners take one ``data_path``.  Returns ``{"pte": ..., "ptd": ...}``.
    """
    pte = Path(pte)
    data = _compat.tensor_data_files(program)
    if len(data) > 1:
        raise ValueError(
            f"the program has data for {len(data)} files ({', '.join(sorted(data))}); ExecuTorch's runners load one "
            "data_path: lower every delegate with the same external_data"
        )
    targets = {"pte": pte, **({"ptd": data_path(pte)} if data and with_data else {})}
    pending: dict[str, str] = {}
    try:
        for kind, target in targets.items():
            handle, temporary = tempfile.mkstemp(dir=target.parent or ".", prefix=f".{target.name}.", suffix=".partial")
            pending[kind] = temporary
            os.chmod(temporary, 0o666 & ~_umask())  # what open() would give the file; mkstemp's is 0600
            with os.fdopen(handle, "wb") as file:
                if kind == "pte":
                    program.write_to_file(file)
                else:
                    next(iter(data.values())).write_to_file(file)
        for kind, target in targets.items():
            os.replace(pending.pop(kind), target)
    except BaseException:
        for temporary in pending.values():
            Path(temporary).unlink(missing_ok=True)
        raise
    return targets


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
