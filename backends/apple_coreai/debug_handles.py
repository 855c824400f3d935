"""What each profiling event of a Core AI delegate covers: its ``PreprocessResult.debug_handle_map``.

ExecuTorch's devtools (``Inspector`` over an ETDump and an ETRecord) match a
delegate's events to the edge graph through the map ``preprocess`` returns:
event name to the debug handles of the edge nodes the event covers
(``DelegateMappingBuilder``).  The host runtime logs, per delegate call:

* ``coreai:<function>`` (``coreai:main``): the whole call, covering every
  node of the delegate;
* with ``debug_info="full"``, one event per node of the delegate's graph its
  Core AI ops came from, named as the node is named there: a composite's call
  site ``call_<path>_<i>``, another op ``aten_addmm_default``
  (:mod:`.runtime.profiling`).  The same names appear in the asset's debug
  locations, so a device profile can be mapped back with this map too.

A pure function over the graph the converter saw (call sites renamed, edge
node metadata kept).
"""

from __future__ import annotations

import torch.fx as fx
from executorch.exir.backend.utils import DelegateMappingBuilder

#: ``node.meta`` key of an edge node's debug handle (ExecuTorch's ``DEBUG_HANDLE_KEY``).
DEBUG_HANDLE_KEY = "debug_handle"


def delegate_event(function: str) -> str:
    """The name of a delegate call's event; ``:`` keeps it apart from every FX node name."""
    return f"coreai:{function}"


def debug_handle_map(graph: fx.Graph, function: str) -> dict[str, tuple[int, ...]]:
    """``{event name: edge debug handles}`` for one delegate: the whole call, then each node with a handle."""
    nodes = [n for n in graph.nodes if n.op == "call_function" and n.meta.get(DEBUG_HANDLE_KEY) is not None]
    if not nodes:
        return {}
    builder = DelegateMappingBuilder()
    builder.insert_delegate_mapping_entry(nodes=nodes, identifier=delegate_event(function))
    for node in nodes:
        builder.insert_delegate_mapping_entry(nodes=node, identifier=node.name)
    return builder.get_delegate_mapping()
