"""Per-node profiling events of a Core AI delegate, from coreai-core's own profiler.

coreai-core times every op it runs (``coreai.runtime.Profiler``: a begin and
an end event per op, each with the op's compile id and a nanosecond stamp of
``CLOCK_MONOTONIC_RAW`` on Linux), and a compiled model's debug information
maps each compile id to the torch nodes the op came from, each with its
module call stack.  When the asset keeps coreai-torch's full debug locations
(``debug_info="full"``), an op's *outermost* source (the one with the longest
call stack) is a node of the delegate's own graph: the composite's call site
(``call_<path>_<i>``) for ops inside a composite, the op's node
(``aten_addmm_default``) otherwise.  Those names are the keys of the
delegate's ``debug_handle_map`` (:mod:`coreai_partitioner.backends.apple_coreai.debug_handles`),
so one event per node, from its first op's start to its last op's end, is what
ExecuTorch's Inspector maps back to the edge graph.

Without full debug locations the debug information names no source, and the
delegate logs only its whole call.  Pure functions, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

_WRAPPERS = {"array", "dictionary", "string", "integer", "double", "bool"}


def _plain(value: Any) -> Any:
    """coreai-core's tagged JSON (``{"string": {"_0": "x"}}``) as plain values."""
    if isinstance(value, dict):
        if len(value) == 1:
            (tag, inner), = value.items()
            if tag in _WRAPPERS and isinstance(inner, dict) and set(inner) == {"_0"}:
                return _plain(inner["_0"])
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def op_sources(debug_infos: bytes) -> dict[int, str]:
    """``{compile id: the delegate-graph node its op came from}`` for every op whose debug info names one."""
    sources: dict[int, str] = {}
    for table in json.loads(debug_infos or b"[]"):
        for operation in table.get("operations", ()):
            candidates: list[tuple[int, str]] = []
            pending: list[str] = []
            for entry in operation.get("metadatas", ()):
                value = _plain(entry.get("value"))
                if entry.get("key") == "sources":
                    pending = [name for source in value for name in source.get("identifiers", ())[:1]]
                elif entry.get("key") == "call_stack" and pending:
                    candidates += [(len(value), name) for name in pending]
                    pending = []
            if candidates:
                depth = max(length for length, _ in candidates)
                sources[operation["odixId"]] = next(name for length, name in candidates if length == depth)
    return sources


@dataclass
class Recorder:
    """The callbacks of a ``coreai.runtime.Profiler``: op intervals as ``(compile id, begin ns, end ns)``."""

    intervals: list[tuple[int, int, int]] = field(default_factory=list)
    _open: dict[int, tuple[int, int]] = field(default_factory=dict)
    _next: int = 0

    def begin(self, event: Any) -> int:
        self._next += 1
        self._open[self._next] = (event.compile_ids.id, event.timestamp)
        return self._next

    def end(self, event: Any, interval: int) -> None:
        started = self._open.pop(interval, None)
        if started is not None:
            self.intervals.append((started[0], started[1], event.timestamp))

    def take(self) -> list[tuple[int, int, int]]:
        intervals, self.intervals = self.intervals, []
        self._open.clear()
        return intervals


def node_spans(intervals: Iterable[tuple[int, int, int]], sources: dict[int, str]) -> list[tuple[str, int, int]]:
    """One ``(node, first begin, last end)`` per node the timed ops came from, in order of first begin."""
    spans: dict[str, list[int]] = {}
    for compile_id, begin, end in intervals:
        node = sources.get(compile_id)
        if node is None:
            continue
        span = spans.setdefault(node, [begin, end])
        span[0], span[1] = min(span[0], begin), max(span[1], end)
    return sorted(((node, begin, end) for node, (begin, end) in spans.items()), key=lambda span: span[1])
