"""One description of what a ``.pte`` ships, for the CLI, the examples and reports.

    from coreai_partitioner.verify.describe import describe
    print(describe("model.pte"))

A table per ``.pte``: each method's delegates, their packaging and asset
size, and the composites each delegate invokes.  Tables are ``tabulate``'s,
as ExecuTorch's own tools print them.
"""

from __future__ import annotations

import operator
import os
import tempfile
from collections import Counter
from typing import Any

from coreai_partitioner.backends.apple_coreai.runtime.asset_ir import AssetSummary, asset_ir, summarize_ir
from coreai_partitioner.backends.apple_coreai.runtime.pte import Delegate, read_pte
from coreai_partitioner.verify.table import table


def describe(
    pte: bytes | str | os.PathLike, *, sidecar_dir: str | os.PathLike | None = None, graphs: bool = False
) -> str:
    """The methods, delegates and composites of a serialized ``.pte`` (bytes or path), as tables.

    ``graphs=True`` adds, per Core AI delegate, its graphs (``noinline`` and
    composite declarations with their attributes).  Sidecar assets are looked
    for in ``sidecar_dir``, by default the ``.pte``'s directory.
    """
    contents = read_pte(pte)
    if sidecar_dir is None and isinstance(pte, (str, os.PathLike)):
        sidecar_dir = os.path.dirname(os.fspath(pte)) or "."
    methods = [
        [method, len(contents.plans[method].instructions), len(contents.plans[method].delegate_calls)]
        for method in contents.methods
    ]
    rows, details = [], []
    with tempfile.TemporaryDirectory() as directory:
        for delegate in contents.delegates:
            summary, note = _summary(delegate, directory, sidecar_dir)
            composites = ", ".join(f"{name} x{n}" for name, n in sorted(summary.composites().items())) if summary else ""
            rows.append(
                [
                    delegate.method,
                    delegate.index,
                    delegate.backend_id,
                    delegate.packaging or "-",
                    f"{delegate.asset_bytes:,}" if delegate.files else "outside the .pte",
                    summary.invoke_count if summary else "-",
                    note or composites or "none",
                ]
            )
            if graphs and summary:
                details.append(f"delegate {delegate.index} of '{delegate.method}':\n" + _graph_table(summary))
    return "\n\n".join(
        (
            f".pte: {contents.size:,} bytes, {len(contents.methods)} method(s)",
            table(methods, ["method", "instructions", "delegate calls"]),
            table(rows, ["method", "delegate", "backend", "packaging", "asset bytes", "coreai.invoke", "composites"]),
            *details,
        )
    )


def _summary(delegate: Delegate, directory: str, sidecar_dir: Any) -> tuple[AssetSummary | None, str]:
    if not delegate.is_coreai:
        return None, "not a Core AI delegate"
    try:
        return summarize_ir(asset_ir(delegate.asset_path(directory, sidecar_dir=sidecar_dir))), ""
    except (ValueError, FileNotFoundError) as error:
        return None, str(error)


def _graph_table(summary: AssetSummary) -> str:
    invokes = summary.invokes
    rows = [
        [graph.name, "noinline" if graph.noinline else "", graph.composite or "", graph.composite_attrs or "", invokes.get(graph.name, 0)]
        for graph in summary.graphs
    ]
    return table(rows, ["graph", "", "composite", "attributes", "invoked"])


def outside_delegates(lowered: Any) -> dict[str, Counter]:
    """Per method, the ops of ``lowered`` (what ``to_edge_transform_and_lower`` or :func:`~coreai_partitioner.lower`
    returns) left outside every delegate, counted by name (``aten.add.Tensor``): what ExecuTorch's portable
    kernels run.  ``CoreAIPartitioner.refused`` says why an op the converter knows stayed outside.
    """
    from executorch.exir.delegate import executorch_call_delegate

    found = {}
    for method in lowered.methods:
        found[method] = Counter(
            getattr(node.target, "__name__", str(node.target))
            for node in lowered.exported_program(method).graph.nodes
            if node.op == "call_function" and node.target not in (executorch_call_delegate, operator.getitem)
        )
    return found
