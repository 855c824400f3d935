"""Convert one delegate's edge program, with its composite records, to an AIProgram."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from torch.export import ExportedProgram

from coreai_partitioner import _compat
from coreai_partitioner.call_sites import resolve_call_sites

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


def convert(program: ExportedProgram, records: Sequence[Any]) -> Any:
    """Convert ``program`` (ATen form) to an ``AIProgram`` with ``records`` as composites.

    The records are re-resolved against this very graph first, so each
    lowering coreai-torch registers by node name matches a node here.
    """
    graphs = [program.graph] + [record.exported_program.graph for record in records]
    resolution = resolve_call_sites(records, graphs)
    if resolution.mismatches:
        raise RuntimeError(
            "internal error: the delegate's call sites no longer match the records "
            "the partitioner paired them with:\n  "
            + "\n  ".join(str(m) for m in resolution.mismatches)
        )
    logger.info("converting a delegate with %d externalized call site(s)", len(records))
    converter = _compat.TorchConverter()
    converter.add_exported_program(
        program, _externalized_exported_programs=list(resolution.records) or None
    )
    return converter.to_coreai()
