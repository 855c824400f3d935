"""Where a model's own code puts the Core AI delegate's boundaries, as annotations on the ops it traces.

Two marks, each kept by a trace under :func:`_compat.preserve_node_meta`
(``torch.fx.traceback.annotate`` writes them into ``node.meta["custom"]``):

* :func:`outside_delegate`: the ops stay outside every delegate, on
  ExecuTorch's portable kernels (:func:`mark_outside` tags them
  ``do_not_delegate`` before partitioning);
* :func:`segment`: the ops belong to delegate number ``i`` of their
  program; the partitioner splits what it would have made one delegate
  along these numbers (:func:`split_by_segment`), a graph break.

Pure functions over FX graphs and nodes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch

from coreai_partitioner import _compat

#: ``node.meta["custom"]`` keys.
OUTSIDE = "coreai_partitioner.outside_delegate"
SEGMENT = "coreai_partitioner.segment"


@contextlib.contextmanager
def outside_delegate() -> Iterator[None]:
    """Ops traced inside stay outside the Core AI delegate."""
    with _compat.annotate_nodes({OUTSIDE: True}):
        yield


def segment(index: int) -> contextlib.AbstractContextManager:
    """Ops traced inside go to the ``index``-th delegate of their program."""
    return _compat.annotate_nodes({SEGMENT: index})


def mark_outside(graph: torch.fx.Graph) -> int:
    """Tag the nodes traced under :func:`outside_delegate` ``do_not_delegate``; returns how many."""
    marked = 0
    for node in graph.nodes:
        if _custom(node).get(OUTSIDE):
            _compat.do_not_delegate(node)
            marked += 1
    return marked


def _custom(node: torch.fx.Node) -> dict:
    return node.meta.get("custom") or {}


def segments_of(nodes: Iterable[torch.fx.Node]) -> dict[torch.fx.Node, int]:
    """Each node's segment: its own mark, else the latest of its inputs', else the earliest of its users'.

    Unmarked ops after marked ones (the final norm, the lm_head) join the last
    segment they read from; unmarked ops that read none (a weight's
    transpose, the embedding of the tokens) join the first that reads them.
    """
    nodes = list(nodes)
    found: dict[torch.fx.Node, int] = {}
    for node in nodes:
        mark = _custom(node).get(SEGMENT)
        if mark is None:
            inputs = [found[arg] for arg in node.all_input_nodes if arg in found]
            mark = max(inputs) if inputs else None
        if mark is not None:
            found[node] = int(mark)
    for node in reversed(nodes):
        if node not in found:
            users = [found[user] for user in node.users if user in found]
            found[node] = min(users) if users else 0
    return found


def split_by_segment(graph: torch.fx.Graph, partitions: list[set[torch.fx.Node]]) -> list[set[torch.fx.Node]]:
    """The nodes of ``partitions`` (node sets) regrouped by segment, one partition each; as they are when
    nothing is marked.

    A segment is one delegate even where the greedy partitioner made two of
    it (ops whose only readers are outside: a KV cache's new rows); one that
    would depend on itself through an op outside is refused, naming it.
    """
    if not any(SEGMENT in _custom(node) for node in graph.nodes):
        return partitions
    segments = segments_of(graph.nodes)
    by_segment: dict[int, set[torch.fx.Node]] = {}
    for nodes in partitions:
        for node in nodes:
            by_segment.setdefault(segments[node], set()).add(node)
    for key, nodes in by_segment.items():
        if not _compat.acyclic_partition(list(nodes)):
            raise ValueError(
                f"graph break: segment {key}'s ops read, through an op outside the delegate, what segment {key} "
                "itself computes; move that op into a segment, or out of the marked code"
            )
    return [by_segment[key] for key in sorted(by_segment)]
