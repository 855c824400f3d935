"""Convert one delegate's edge program, with its composite records, to an AIProgram."""

from __future__ import annotations

import copy
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from torch.export import ExportedProgram

from coreai_partitioner import _compat
from coreai_partitioner.call_sites import call_sites_by_op, module_path, name_call_sites, resolve_call_sites
from coreai_partitioner.programs import with_own_graph

logger = logging.getLogger(__name__)


def to_aten_in_place(program: ExportedProgram) -> ExportedProgram:
    """Rewrite an edge program, in place, into the ATen form coreai-torch lowers.

    Upstream's ``_prepare_program_for_conversion`` does the same on a deep copy;
    the program ``preprocess`` receives is already ExecuTorch's private copy.
    Node names are kept, so call sites claimed by the partitioner stay findable.
    """
    _compat.ReplaceCopyOpsWithFunctionalPass()(program.graph_module)
    for node in program.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, _compat.EdgeOpOverload):
            node.target = node.target._op
    program.graph_module.recompile()
    return program


def with_build_independent_names(program: ExportedProgram, records: Sequence[Any]) -> list[Any]:
    """Name call sites and composite graphs after submodule paths and call-site indices.

    coreai-torch's op names and graph names carry random suffixes, and both
    reach the asset (graph symbols, value and boundary names), so two builds of
    one model would differ.  Renames the call sites of ``program`` (ours to
    change) and returns new records: named ``<path>_<i>``, and, where a record's
    own program holds nested call sites, over a renamed copy of its graph.
    """
    paths = {record.op_name: module_path(record) for record in records}
    name_call_sites(program.graph, paths)
    program.graph_module.recompile()
    seen: Counter[str] = Counter()
    named = []
    for record in records:
        path = module_path(record)
        new = copy.copy(record)
        new.name = f"{path}_{seen[path]}"
        seen[path] += 1
        if call_sites_by_op(record.exported_program.graph):
            new.exported_program = with_own_graph(record.exported_program)
            name_call_sites(new.exported_program.graph, paths)
        named.append(new)
    return named


def convert(program: ExportedProgram, records: Sequence[Any]) -> Any:
    """Convert ``program`` (ATen form) to an ``AIProgram`` with ``records`` as composites.

    The records are re-resolved against this very graph first, so each
    lowering coreai-torch registers by node name matches a node here.
    """
    records = with_build_independent_names(program, records)
    graphs = [program.graph] + [record.exported_program.graph for record in records]
    resolution = resolve_call_sites(records, graphs)
    if resolution.mismatches:
        raise RuntimeError(
            "internal error: the delegate's call sites no longer match the records "
            "the partitioner paired them with:\n  "
            + "\n  ".join(str(m) for m in resolution.mismatches)
        )
    logger.info("converting a delegate with %d externalized call site(s)", len(records))
    converter = _compat.BuildIndependentConverter()
    converter.add_exported_program(
        program, _externalized_exported_programs=list(resolution.records) or None
    )
    return converter.to_coreai()
