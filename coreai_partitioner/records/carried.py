"""Records carried on their call sites, from the partitioner to the backend.

ExecuTorch gives a backend's ``preprocess`` nothing but the delegate's program
and its compile specs, and compile specs are serialized into the ``.pte``.
Records (which hold whole sub-exported programs) must not be.  So
``partition()`` puts each call site's record on the node itself
(``node.meta[CALL_SITE_KEY]``), paired once; the value survives ExecuTorch's
copies of the graph (a copy is the same reference, never a copy of the
weights) and lives exactly as long as the graph that carries it.  Nested
records ride on their parent's :class:`CallSiteRecord`, keyed by the call
site's name in the parent's sub-export.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch.fx as fx

from coreai_partitioner.records.call_sites import EXTERNALIZE_NAMESPACE, call_sites_by_op

#: ``node.meta`` key of a claimed call site's :class:`CallSiteRecord`.
CALL_SITE_KEY = "coreai_partitioner_record"


class CallSiteRecord:
    """The record a call site was paired with, and the records of the call sites nested in it."""

    __slots__ = ("record", "nested")

    def __init__(self, record: Any) -> None:
        self.record = record
        #: ``{call-site name in record.exported_program.graph: CallSiteRecord}``
        self.nested: dict[str, CallSiteRecord] = {}

    def __copy__(self) -> CallSiteRecord:
        return self

    def __deepcopy__(self, memo: dict) -> CallSiteRecord:
        # ExecuTorch deep-copies node.meta with the graph; the record (a whole
        # sub-exported program) is shared, never copied.
        return self

    def __reduce__(self) -> Any:
        raise TypeError(
            f"the record of externalized call site '{self.record.name}' is build-time state "
            "and cannot be pickled; lower in the process that ran externalize_modules"
        )

    def __repr__(self) -> str:
        return f"CallSiteRecord({self.record.name!r}, nested={sorted(self.nested)})"


def claim_call_sites(
    records: Sequence[Any], by_graph: dict[fx.Graph, list[tuple[fx.Node, int]]], graph: fx.Graph
) -> int:
    """Put each paired call site's record on the call sites of ``graph``; returns how many.

    ``by_graph`` is :meth:`Pairing.by_graph`.  Nested call sites (paired in the
    records' own sub-exports) are attached to their parent's :class:`CallSiteRecord`.
    """
    refs = [CallSiteRecord(record) for record in records]
    for index, record in enumerate(records):
        for node, nested in by_graph.get(record.exported_program.graph, ()):
            refs[index].nested[node.name] = refs[nested]
    claimed = by_graph.get(graph, ())
    for node, index in claimed:
        node.meta[CALL_SITE_KEY] = refs[index]
    return len(claimed)


def delegate_call_sites(graph: fx.Graph) -> Iterator[tuple[fx.Node, CallSiteRecord]]:
    """Every call site of a delegate's graph with its record, in graph order.

    Raises when a call site reached the backend without one.
    """
    for op_name, nodes in call_sites_by_op(graph).items():
        for node in nodes:
            claimed = node.meta.get(CALL_SITE_KEY)
            if claimed is None:
                raise RuntimeError(
                    f"externalized call site '{node.name}' (op {EXTERNALIZE_NAMESPACE}::{op_name}) "
                    "reached the Core AI backend without a record. Lower with "
                    "coreai_partitioner.CoreAIPartitioner(externalized_modules=records), "
                    "passing the records externalize_modules returned for this program."
                )
            yield node, claimed
