"""Copies of exported programs that own their graph and share their tensors."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from torch.export import ExportedProgram

from coreai_partitioner import _compat


def with_own_graph(
    program: ExportedProgram,
    state_dict: Mapping[str, Any] | None = None,
    constants: Mapping[str, Any] | None = None,
) -> ExportedProgram:
    """``program`` over a copy of its graph module, with the same (or the given) tensors.

    Exported programs lift weights out of the graph module, so the copy costs
    nodes, not weights; the tensors are shared, never copied.  A graph that
    names no attribute of its module (no branch of a ``cond``) is copied alone:
    the new program makes the one module it needs (copying the module too
    compiles its code twice more).
    """
    root = program.graph_module
    if any(node.op in ("get_attr", "call_module") for node in root.graph.nodes):
        root = graph_module_copy(program)
        graph = root.graph
    else:
        graph = copy.deepcopy(root.graph)
        _keep_node_names(root.graph, graph)
    copied = _compat.rebuilt(
        program,
        root=root,
        graph=graph,
        signature=copy.deepcopy(program.graph_signature),
        state_dict=dict(program.state_dict if state_dict is None else state_dict),
        range_constraints=copy.deepcopy(program.range_constraints),
        module_call_graph=copy.deepcopy(program.module_call_graph),
        example_inputs=None,
        constants=dict(program.constants if constants is None else constants),
        verifiers=[program.verifier],
    )
    copied.graph_module.meta.update(copy.deepcopy(dict(program.graph_module.meta)))
    return copied


def graph_module_copy(program: ExportedProgram) -> Any:
    """A copy of ``program``'s graph module whose nodes keep the names its signature uses."""
    graph_module = copy.deepcopy(program.graph_module)
    _keep_names(program, graph_module)
    return graph_module


def deep_copy(program: ExportedProgram, memo: dict | None = None) -> ExportedProgram:
    """``copy.deepcopy(program)``, weights included, with the node names the signature uses."""
    copied = copy.deepcopy(program, memo)
    _keep_names(program, copied.graph_module)
    return copied


def _keep_names(program: ExportedProgram, graph_module: Any) -> None:
    _keep_node_names(program.graph, graph_module.graph)
    graph_module.recompile()


def _keep_node_names(original: Any, copied: Any) -> None:
    for node, copy_of_node in zip(original.nodes, copied.nodes):
        copy_of_node.name = node.name  # a copy renames nodes that shadow builtins ("input")
