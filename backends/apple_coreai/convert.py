"""Convert one delegate's program, with the records on its call sites, to an AIProgram."""

from __future__ import annotations

import contextlib
import copy
import io
import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch.fx as fx
from torch.export import ExportedProgram

from .manifest import MAIN_ENTRYPOINT

from coreai_partitioner import _compat
from .asset import BuildIndependentConverter, name_folded_blobs, to_aten
from coreai_partitioner.records.carried import CallSiteRecord, delegate_call_sites
from coreai_partitioner.records.call_sites import call_sites_by_op, module_path, name_call_sites
from coreai_partitioner.backends.apple_coreai.passes import (
    expand_repeated_heads, index_selects, order_state_writes, packed_int4_constants, pool_arguments_in_full,
    state_operands_as_values,
)
from coreai_partitioner.records.programs import with_own_graph

from .debug_info import DEFAULT as DEFAULT_DEBUG_INFO, keep_only

logger = logging.getLogger(__name__)


def converter_records(graph: fx.Graph, prefix: str = "") -> list[Any]:
    """The records coreai-torch's converter takes for the delegate ``graph``.

    Reads the record the partitioner put on each call site (and the records
    nested in theirs), renames the call sites ``call_<path>_<i>`` and returns
    one record per distinct record: named ``<path>_<i>``, its
    ``source_nodes`` naming its call sites, and, where its own program holds
    nested call sites or repeats heads by ``index_select``, over a renamed or
    rewritten copy of its graph.  coreai-torch's op
    and graph names carry per-process suffixes and both reach the asset, so
    the names are what make two builds of one model alike.  ``prefix``
    starts each record's name: the composite graphs of several functions in
    one asset are symbols of one module, so each function's need their own.
    ``graph`` is renamed in place; the records themselves are never changed.
    """
    sites = list(delegate_call_sites(graph))
    _rename(graph, [claimed for _, claimed in sites])
    named: dict[int, Any] = {}
    seen: Counter[str] = Counter()

    def visit(node_name: str, claimed: CallSiteRecord) -> None:
        new = named.get(id(claimed))
        if new is None:
            path = module_path(claimed.record)
            new = named[id(claimed)] = copy.copy(claimed.record)
            new.name = f"{prefix}{path}_{seen[path]}"
            new.source_nodes = []
            seen[path] += 1
            if claimed.nested or index_selects(claimed.record.exported_program.graph):
                new.exported_program = with_own_graph(claimed.record.exported_program)
                expand_repeated_heads(new.exported_program.graph_module)
            if claimed.nested:
                nested = [
                    (node, claimed.nested[node.name])
                    for nodes in call_sites_by_op(new.exported_program.graph).values()
                    for node in nodes
                ]
                _rename(new.exported_program.graph, [child for _, child in nested])
                for node, child in nested:
                    visit(node.name, child)
        if node_name not in new.source_nodes:
            new.source_nodes.append(node_name)

    for node, claimed in sites:
        visit(node.name, claimed)
    return list(named.values())


def _rename(graph: fx.Graph, claimed: list[CallSiteRecord]) -> None:
    name_call_sites(graph, {c.record.op_name: module_path(c.record) for c in claimed})


def convert(program: ExportedProgram, debug_info: str = DEFAULT_DEBUG_INFO) -> Any:
    """Convert a delegate's program (edge form, owned by the caller) to an ``AIProgram`` whose function is ``main``.

    The program is rewritten in place: ATen targets, call sites renamed, pool arguments written out
    (:func:`~.passes.pool_arguments_in_full`),
    repeated heads expanded (:func:`~.passes.expand_repeated_heads`),
    state writes in state order (:func:`~.passes.order_state_writes`), a state read
    by a composite made a value first (:func:`~.passes.state_operands_as_values`),
    packed int4 weights handed over as they are (:func:`~.passes.packed_int4_constants`).
    Op locations keep what ``debug_info`` asks for (:mod:`.debug_info`).  coreai-core's own names (the graphs it
    builds per call, the blobs its optimizer folds) are made independent of the process
    (:func:`~._compat.graph_names_counted`, :func:`~.asset.name_folded_blobs`).
    """
    return convert_functions({MAIN_ENTRYPOINT: program}, debug_info)


def convert_functions(programs: Mapping[str, ExportedProgram], debug_info: str = DEFAULT_DEBUG_INFO) -> Any:
    """Convert several delegates' programs, as :func:`convert` does, to one ``AIProgram``: a function each, by name.

    Core AI keeps one copy of a constant the functions share, so two methods
    over the same weights (an LLM's prefill and decode) store them once.
    """
    converter = BuildIndependentConverter(stack_traces=debug_info == "full")
    for function, program in programs.items():
        records = converter_records(program.graph, prefix="" if len(programs) == 1 else f"{function}__")
        to_aten(program)
        pool_arguments_in_full(program.graph_module)
        expand_repeated_heads(program.graph_module)
        order_state_writes(program)
        state_operands_as_values(program)
        packed_int4_constants(program)
        logger.info("converting %s with %d externalized call site(s)", function, len(records))
        converter.add_program(program, function, records or None)
    printed = io.StringIO()
    # coreai-torch prints its version and progress to stdout
    with contextlib.redirect_stdout(printed), _compat.graph_names_counted():
        converted = converter.to_coreai()
    logger.debug("coreai-torch: %s", printed.getvalue().strip())
    name_folded_blobs(converted)
    keep_only(converted, debug_info)
    return converted
