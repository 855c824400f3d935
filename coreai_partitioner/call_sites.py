"""Re-resolve externalized call sites by op target.

coreai-torch records each externalized call site by FX node *name*
(``_ExternalizedExportedProgram.source_nodes``).  Any pass that rebuilds the
graph (ExecuTorch's ``to_edge`` among them) renames nodes, but keeps the op
target ``coreai_torch_ext::<op_name>.default``.  The functions here find every
call site by that target and pair it with its record, so the converter's
per-node lowerings match the graph that is actually converted.

Pure functions over ``torch.fx`` graphs: no ExecuTorch or Core AI imports, no
I/O, no global state.  A *record* is any object with ``name``, ``op_name``,
``source_nodes`` and ``exported_program`` attributes (coreai-torch's
``_ExternalizedExportedProgram``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

#: The namespace coreai-torch registers externalized submodules under.
EXTERNALIZE_NAMESPACE = "coreai_torch_ext"

_EDGE_PREFIX = EXTERNALIZE_NAMESPACE + "."
_RECORD_SUFFIX = re.compile(r"_[0-9a-f]{8}$")


def externalized_op_name(target: Any) -> str | None:
    """``<op_name>`` of a ``coreai_torch_ext::<op_name>.default`` target, else None.

    Accepts the ATen ``OpOverload`` (``__name__`` is ``"<op>.default"``) and
    ExecuTorch's ``EdgeOpOverload`` (``"coreai_torch_ext.<op>.default"``).
    """
    if getattr(target, "namespace", None) != EXTERNALIZE_NAMESPACE:
        return None
    name = getattr(target, "__name__", "")
    if name.startswith(_EDGE_PREFIX):
        name = name[len(_EDGE_PREFIX) :]
    op_name, _, overload = name.rpartition(".")
    return op_name if overload == "default" and op_name else None


def call_sites_by_op(graph: fx.Graph) -> dict[str, list[fx.Node]]:
    """Every externalized call site in ``graph``, bucketed by op name, in graph order."""
    buckets: dict[str, list[fx.Node]] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        op_name = externalized_op_name(node.target)
        if op_name is not None:
            buckets.setdefault(op_name, []).append(node)
    return buckets


def module_path(record: Any) -> str:
    """The submodule path of a record (``"layers.0.norm"``), without its graph suffix."""
    return _RECORD_SUFFIX.sub("", record.name)


def op_module_path(op_name: str) -> str:
    """The submodule path an op name was made from, dots shown as ``_`` (no record to ask)."""
    return _RECORD_SUFFIX.sub("", op_name)


@dataclass(frozen=True)
class CallSiteMismatch:
    """An op whose call sites in one graph do not match its records one to one."""

    op_name: str
    module_path: str
    call_sites: int
    records: int

    def __str__(self) -> str:
        where = (
            f"externalized submodule '{self.module_path}' "
            f"(op {EXTERNALIZE_NAMESPACE}::{self.op_name})"
        )
        if self.call_sites == 0:
            return (
                f"{where} has {self.records} record(s) but no call site in the "
                "program being lowered. The records probably come from a different "
                "model or an older export; pass the records returned by the "
                "externalize_modules call that produced this program."
            )
        return (
            f"{where} has {self.call_sites} call site(s) in the program but "
            f"{self.records} record(s), so they cannot be paired by graph order; "
            "its recorded node names are kept. A transform between "
            "externalize_modules and lowering probably duplicated or removed "
            "call sites (for example dead-code elimination of an unused result); "
            "re-run externalize_modules on the transformed model, or apply the "
            "transform before externalizing."
        )


@dataclass(frozen=True)
class Resolution:
    """The outcome of :func:`resolve_call_sites`.

    ``records`` are new objects, one per input record and in the same order,
    whose ``source_nodes`` name their call sites in the searched graphs.
    """

    records: tuple[Any, ...]
    mismatches: tuple[CallSiteMismatch, ...]

    def by_call_site(self) -> dict[tuple[str, str], Any]:
        """``{(op_name, node_name): record}`` over every resolved call site."""
        return {
            (record.op_name, name): record
            for record in self.records
            for name in record.source_nodes
        }


def resolve_call_sites(records: Sequence[Any], graphs: Iterable[fx.Graph]) -> Resolution:
    """Pair every record with its call site(s) in ``graphs`` by op target.

    ``graphs`` are all the graphs the records may live in: the graph being
    converted and the records' own sub-exports (a nested submodule's call site
    lives in its parent's sub-export).  Each graph is walked once.

    Within one graph, the call sites of one op pair with that op's records in
    graph order, which is the order coreai-torch prepared them in.  A record
    whose op occurs in several graphs (a nested submodule inside a parent
    called twice) names its call site in each.  When an op's call-site count in
    a graph differs from its record count, the graph changed shape, not just
    names: that op keeps its recorded names and a :class:`CallSiteMismatch`
    says so.
    """
    seen: set[int] = set()
    buckets: list[dict[str, list[fx.Node]]] = []
    for graph in graphs:
        if id(graph) not in seen:
            seen.add(id(graph))
            buckets.append(call_sites_by_op(graph))

    records_by_op: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        records_by_op.setdefault(record.op_name, []).append(index)

    sources: list[list[str] | None] = [None] * len(records)
    mismatches: list[CallSiteMismatch] = []
    for op_name, indices in records_by_op.items():
        site_lists = [bucket[op_name] for bucket in buckets if op_name in bucket]
        counts = [len(sites) for sites in site_lists]
        if not site_lists or any(count != len(indices) for count in counts):
            off = next((c for c in counts if c != len(indices)), 0)
            mismatches.append(
                CallSiteMismatch(op_name, module_path(records[indices[0]]), off, len(indices))
            )
            continue
        for sites in site_lists:
            for index, node in zip(indices, sites):
                names = sources[index] = sources[index] or []
                if node.name not in names:
                    names.append(node.name)

    resolved = []
    for record, names in zip(records, sources):
        new = copy.copy(record)
        new.source_nodes = list(record.source_nodes) if names is None else names
        resolved.append(new)
    return Resolution(tuple(resolved), tuple(mismatches))


def name_call_sites(graph: fx.Graph, module_paths: dict[str, str]) -> None:
    """Rename ``graph``'s call sites after their submodule: ``call_<path>_<i>``.

    ``module_paths`` maps op names to submodule paths; ``i`` counts the op's
    call sites in graph order.  Node names reach the converted asset (value
    and boundary names), and op names carry a per-process suffix, so this is
    what makes two builds of one model name their call sites alike.
    """
    taken = {node.name for node in graph.nodes}
    for op_name, nodes in call_sites_by_op(graph).items():
        stem = "call_" + re.sub(r"\W", "_", module_paths.get(op_name, op_name))
        for index, node in enumerate(nodes):
            name = f"{stem}_{index}"
            while name in taken and name != node.name:
                name += "_"
            taken.discard(node.name)
            taken.add(name)
            node.name = name


def records_in_graph(records: Sequence[Any], graph: fx.Graph) -> list[Any]:
    """The records whose call sites lie in ``graph``, with their nested records.

    A record belongs to ``graph`` when one of its ``source_nodes`` is a call
    site of its op there; a nested record belongs when its call site lies in
    the sub-export of a record that belongs.  Input order is kept.
    """
    selected: set[int] = set()
    frontier = [graph]
    while frontier:
        sites = {
            (op_name, node.name)
            for g in frontier
            for op_name, nodes in call_sites_by_op(g).items()
            for node in nodes
        }
        frontier = []
        for index, record in enumerate(records):
            if index in selected:
                continue
            if any((record.op_name, name) in sites for name in record.source_nodes):
                selected.add(index)
                frontier.append(record.exported_program.graph)
    return [record for index, record in enumerate(records) if index in selected]
