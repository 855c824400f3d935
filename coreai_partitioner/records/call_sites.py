"""Re-resolve externalized call sites by op target.

coreai-torch records each externalized call site by FX node *name*
(``_ExternalizedExportedProgram.source_nodes``).  Any pass that rebuilds the
graph (ExecuTorch's ``to_edge`` among them) renames nodes, but keeps the op
target ``coreai_torch_ext::<op_name>.default``.  The functions here find every
call site by that target and pair it with its record, so the converter's
per-node lowerings match the graph that is actually converted.

Pure functions over ``torch.fx`` graphs: no ExecuTorch or Core AI imports, no
I/O, no global state.  Pairing is checked against each record's sub-exported
input shapes and dtypes (``meta["val"]``), so a pass that reorders call sites
of different shapes cannot swap their sub-exports.  A *record* is any object with ``name``, ``op_name``,
``source_nodes`` and ``exported_program`` attributes (coreai-torch's
``_ExternalizedExportedProgram``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
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
            f"{self.records} record(s); call sites are paired by input signature where "
            "a record has theirs. A transform between externalize_modules and lowering "
            "probably duplicated or removed call sites (for example dead-code "
            "elimination of an unused result); re-run externalize_modules on the "
            "transformed model, or apply the transform before externalizing."
        )


#: ``(shape, dtype)`` of each tensor input; a symbolic dim is ``None`` (it matches any size).
Signature = tuple[tuple[tuple[int | None, ...], Any], ...]

_NARROWED = {torch.int64: torch.int32, torch.float64: torch.float32}


def _tensor_signature(values: Iterable[Any]) -> Signature | None:
    signature = []
    for value in values:
        if not isinstance(value, torch.Tensor):
            return None
        shape = tuple(d if isinstance(d, int) else None for d in value.shape)
        signature.append((shape, _NARROWED.get(value.dtype, value.dtype)))
    return tuple(signature)


def call_site_signature(node: fx.Node) -> Signature | None:
    """The tensor inputs a call site passes, from ``meta["val"]``; None when unknown."""
    args = [a for a in node.args if a is not None]
    if not all(isinstance(a, fx.Node) for a in args):
        return None
    return _tensor_signature(a.meta.get("val") for a in args)


def record_signature(record: Any) -> Signature | None:
    """The tensor inputs a record's sub-export takes (its user inputs); None when unknown."""
    program = record.exported_program
    signature = getattr(program, "graph_signature", None)
    if signature is None:
        return None
    placeholders = [node for node in program.graph.nodes if node.op == "placeholder"]
    return _tensor_signature(
        node.meta.get("val")
        for node, spec in zip(placeholders, signature.input_specs)
        if spec.kind.name == "USER_INPUT"
    )


def signatures_match(call_site: Signature | None, record: Signature | None) -> bool:
    """Whether a call site may be the one a record was exported for (unknown matches)."""
    if call_site is None or record is None:
        return True
    if len(call_site) != len(record):
        return False
    for (site_shape, site_dtype), (record_shape, record_dtype) in zip(call_site, record):
        if site_dtype != record_dtype or len(site_shape) != len(record_shape):
            return False
        if any(a is not None and b is not None and a != b for a, b in zip(site_shape, record_shape)):
            return False
    return True


def describe_signature(signature: Signature | None) -> str:
    if signature is None:
        return "unknown inputs"
    return ", ".join(
        f"{str(dtype).replace('torch.', '')}[{', '.join('?' if d is None else str(d) for d in shape)}]"
        for shape, dtype in signature
    ) or "no tensor inputs"


@dataclass(frozen=True)
class Pairing:
    """The outcome of :func:`pair_call_sites`.

    ``records[node]`` is the index of the record paired with call site
    ``node``, for every paired call site of every searched graph;
    ``unpaired[node]`` says why a call site has no record.
    """

    records: dict[fx.Node, int]
    unpaired: dict[fx.Node, str]
    mismatches: tuple[CallSiteMismatch, ...]

    def by_graph(self) -> dict[fx.Graph, list[tuple[fx.Node, int]]]:
        """``{graph: [(call site, record index), ...]}`` over the paired call sites."""
        grouped: dict[fx.Graph, list[tuple[fx.Node, int]]] = {}
        for node, index in self.records.items():
            grouped.setdefault(node.graph, []).append((node, index))
        return grouped


def pair_call_sites(records: Sequence[Any], graphs: Iterable[fx.Graph]) -> Pairing:
    """Pair every call site in ``graphs`` with a record, by op target and input signature.

    ``graphs`` are all the graphs the records may live in: the graph being
    lowered and the records' own sub-exports (a nested submodule's call site
    lives in its parent's sub-export).  Each graph is walked once.

    All records of one op come from one submodule instance, so records with
    the same input signature export the same graph.  Within one graph, the
    call sites of one op pair with that op's records in graph order (the
    order coreai-torch prepared them in) when the signatures agree; where they
    disagree (a pass reordered call sites of different shapes) each call site
    pairs with the record exported for its signature.  A call site that no
    record's signature fits, or that fits records of different signatures, is
    left unpaired with the reason.  When an op's call-site count in a graph
    differs from its record count, a :class:`CallSiteMismatch` says so.
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
    signatures: dict[int, Signature | None] = {}

    paired: dict[fx.Node, int] = {}
    unpaired: dict[fx.Node, str] = {}
    mismatches: list[CallSiteMismatch] = []
    for op_name, indices in records_by_op.items():
        for index in indices:
            signatures[index] = record_signature(records[index])
        site_lists = [bucket[op_name] for bucket in buckets if op_name in bucket]
        if not site_lists:
            mismatches.append(CallSiteMismatch(op_name, module_path(records[indices[0]]), 0, len(indices)))
            continue
        for sites in site_lists:
            if len(sites) != len(indices):
                mismatches.append(
                    CallSiteMismatch(op_name, module_path(records[indices[0]]), len(sites), len(indices))
                )
            pairs, reasons = _pair_one_op(sites, indices, signatures)
            paired.update(pairs)
            unpaired.update(reasons)
    return Pairing(paired, unpaired, tuple(mismatches))


def _pair_one_op(
    sites: list[fx.Node], indices: list[int], signatures: dict[int, Signature | None]
) -> tuple[dict[fx.Node, int], dict[fx.Node, str]]:
    site_signatures = [call_site_signature(node) for node in sites]
    if len(sites) == len(indices) and all(
        signatures_match(sig, signatures[i]) for sig, i in zip(site_signatures, indices)
    ):
        return dict(zip(sites, indices)), {}
    pairs: dict[fx.Node, int] = {}
    reasons: dict[fx.Node, str] = {}
    unused = list(indices)
    for node, signature in zip(sites, site_signatures):
        fitting = [i for i in indices if signatures_match(signature, signatures[i])]
        kinds = {signatures[i] for i in fitting}
        if not fitting:
            recorded = sorted({describe_signature(signatures[i]) for i in indices})
            reasons[node] = (
                f"no record was exported for its inputs ({describe_signature(signature)}; "
                f"the records take {' or '.join(recorded)})"
            )
        elif len(kinds) > 1:
            reasons[node] = (
                f"its inputs ({describe_signature(signature)}) fit records of "
                f"{len(kinds)} different signatures, so which one it is cannot be told"
            )
        else:
            # Same instance, same signature: any of these records exports this call site.
            index = next((i for i in unused if i in fitting), fitting[0])
            if index in unused:
                unused.remove(index)
            pairs[node] = index
    return pairs, reasons


@dataclass(frozen=True)
class Resolution:
    """The outcome of :func:`resolve_call_sites`.

    ``records`` are new objects, one per input record and in the same order,
    whose ``source_nodes`` name their call sites in the searched graphs (a
    record no call site paired with keeps its recorded names).
    """

    records: tuple[Any, ...]
    mismatches: tuple[CallSiteMismatch, ...]
    unpaired: tuple[str, ...] = ()


def resolve_call_sites(records: Sequence[Any], graphs: Iterable[fx.Graph]) -> Resolution:
    """Records whose ``source_nodes`` name their call sites in ``graphs``.

    :func:`pair_call_sites`, expressed the way coreai-torch's converter takes
    records; for callers that hand records to ``TorchConverter`` themselves.
    """
    pairing = pair_call_sites(records, graphs)
    names: list[list[str]] = [[] for _ in records]
    for node, index in pairing.records.items():
        if node.name not in names[index]:
            names[index].append(node.name)
    resolved = []
    for record, found in zip(records, names):
        new = copy.copy(record)
        new.source_nodes = found or list(record.source_nodes)
        resolved.append(new)
    return Resolution(tuple(resolved), pairing.mismatches, tuple(node.name for node in pairing.unpaired))


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
