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


def sizes_from_floats(graph: torch.fx.Graph) -> int:
    """Read each symbolic size off a floating tensor where the graph has one of the same shape; returns how many moved.

    ``torch.export`` reads a dynamic dimension off the input it came from: an
    LLM's int64 ``tokens``.  Where the model casts that input to a floating
    dtype (the device form's fp32 tokens), a ``sym_size`` of the cast is the
    same size, and a delegate that needs the size then takes the floating
    tensor instead of the integer one (upstream's device runtime takes only
    fp16/fp32 tensors).
    """
    order = {node: index for index, node in enumerate(graph.nodes)}
    moved = 0
    for node in list(graph.nodes):
        if _compat.aten_op(node.target) is not torch.ops.aten.sym_size.int or _is_floating(node.args[0]):
            continue
        cast = _floating_cast(node.args[0])
        if cast is None or any(order[user] <= order[cast] for user in node.users):
            continue  # no cast, or a reader of the size comes before it
        node.replace_input_with(node.args[0], cast)
        cast.append(node)
        moved += 1
    return moved


def _is_floating(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point


def _floating_cast(node: torch.fx.Node) -> torch.fx.Node | None:
    """A user of ``node`` that is only ``node`` cast to a floating dtype (the same shape), else None; the cast of
    a cast (int64 narrowed to int32, then to fp32) counts."""
    for user in node.users:
        if _compat.aten_op(user.target) is not torch.ops.aten._to_copy.default or set(user.kwargs) - {"dtype"}:
            continue
        if _is_floating(user):
            return user
        found = _floating_cast(user)
        if found is not None:
            return found
    return None


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
