"""Records handed from the partitioner to the backend, as build-time state only.

ExecuTorch gives a backend's ``preprocess`` nothing but the delegate's program
and its compile specs, and compile specs are serialized into the ``.pte``.
Records (which hold whole sub-exported programs) must not be.  So the
partitioner stamps each claimed call site with a key into this process's
table, and the backend looks its records up there.  The table holds them
weakly: they live exactly as long as the partitioner that claimed them.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from typing import Any

import torch.fx as fx

from .call_sites import call_sites_by_op, records_in_graph

#: ``node.meta`` key on a claimed call site; never serialized into the .pte.
CALL_SITE_KEY = "coreai_partitioner_records"

_LOWERINGS: weakref.WeakValueDictionary[int, LoweringRecords] = weakref.WeakValueDictionary()
_KEYS = itertools.count()


class LoweringRecords:
    """The resolved records of one ``partition()`` call."""

    def __init__(self, records: Sequence[Any]) -> None:
        self.records = tuple(records)
        self.key = next(_KEYS)
        _LOWERINGS[self.key] = self

    def claim(self, node: fx.Node) -> None:
        """Stamp ``node`` so the backend finds these records from its delegate."""
        node.meta[CALL_SITE_KEY] = self.key


def records_for_delegate(graph: fx.Graph) -> list[Any]:
    """The records of the call sites in ``graph`` (a delegate), with their nested records.

    Raises when a call site was not claimed by ``CoreAIPartitioner`` with a
    record, or when its records are gone.
    """
    keys: set[int] = set()
    for op_name, nodes in call_sites_by_op(graph).items():
        for node in nodes:
            key = node.meta.get(CALL_SITE_KEY)
            if key is None:
                raise RuntimeError(
                    f"externalized call site '{node.name}' (op coreai_torch_ext::{op_name}) "
                    "reached the Core AI backend without a record. Lower with "
                    "coreai_partitioner.CoreAIPartitioner(externalized_modules=records), "
                    "passing the records externalize_modules returned for this program."
                )
            keys.add(key)
    records: list[Any] = []
    for key in sorted(keys):
        lowering = _LOWERINGS.get(key)
        if lowering is None:
            raise RuntimeError(
                "the records of this delegate's externalized call sites were released "
                "before the backend ran; keep the CoreAIPartitioner alive until "
                "to_edge_transform_and_lower returns."
            )
        records.extend(lowering.records)
    return records_in_graph(records, graph)
