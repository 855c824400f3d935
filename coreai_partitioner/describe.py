"""One description of what a ``.pte`` ships, for the CLI, the examples and reports.

    from coreai_partitioner.describe import describe
    print(describe("model.pte"))

A table per ``.pte``: each method's delegates, their packaging and asset
size, and the composites each delegate invokes.  Tables are ``tabulate``'s,
as ExecuTorch's own tools print them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from .assets import asset_ir, summarize_ir
from .pte import Delegate, read_pte


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain-text table in the project's one style."""
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def delegate_summary(delegate: Delegate, directory: str, sidecar_dir: Any = None) -> tuple[str, int, str]:
    """``(composites as "name xN, ...", coreai.invoke count, note)`` of a Core AI delegate."""
    if not delegate.is_coreai:
        return "", 0, "not a Core AI delegate"
    try:
        path = delegate.asset_path(directory, sidecar_dir=sidecar_dir)
    except (ValueError, FileNotFoundError) as error:
        return "", 0, str(error)
    summary = summarize_ir(asset_ir(path))
    composites = ", ".join(f"{name} x{n}" for name, n in sorted(summary.composites().items()))
    return composites or "none", summary.invoke_count, ""


def describe(pte: bytes | str | os.PathLike, *, sidecar_dir: str | os.PathLike | None = None) -> str:
    """The methods, delegates and composites of a serialized ``.pte`` (bytes or path), as tables."""
    contents = read_pte(pte)
    if sidecar_dir is None and isinstance(pte, (str, os.PathLike)):
        sidecar_dir = os.path.dirname(os.fspath(pte)) or "."
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for delegate in contents.delegates:
            composites, invokes, note = delegate_summary(delegate, directory, sidecar_dir)
            size = f"{delegate.asset_bytes:,}" if delegate.files else "outside the .pte"
            rows.append(
                [delegate.method, delegate.index, delegate.backend_id, delegate.packaging or "-", size, invokes, note or composites]
            )
    methods = [
        [method, len(contents.plans[method].instructions), len(contents.plans[method].delegate_calls)]
        for method in contents.methods
    ]
    return "\n\n".join(
        (
            f".pte: {contents.size:,} bytes, {len(contents.methods)} method(s)",
            table(methods, ["method", "instructions", "delegate calls"]),
            table(rows, ["method", "delegate", "backend", "packaging", "asset bytes", "coreai.invoke", "composites"]),
        )
    )
