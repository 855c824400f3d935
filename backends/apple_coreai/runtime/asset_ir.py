"""What a Core AI asset holds: its graphs, composite declarations and invocations."""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass

_SYMBOL = r'@("[^"]+"|[^\s(]+)'
_GRAPH = re.compile(r"^\s*coreai\.graph\s+((?:[a-z_]+\s+)*)" + _SYMBOL + r"\(")
_COMPOSITE = re.compile(r'composite_declaration<"([^"]+)" = \{(.*)\}>')
_OP_ATTRS = re.compile(r"op_attrs = \{([^}]*)\}")
_INVOKE = re.compile(r"coreai\.invoke\s+" + _SYMBOL + r"\(")


@dataclass(frozen=True)
class GraphInfo:
    name: str
    noinline: bool
    composite: str | None
    #: The composite's ``op_attrs`` as printed, e.g. ``"axes = -1 : si64, eps = ..."``.
    composite_attrs: str | None


@dataclass(frozen=True)
class AssetSummary:
    graphs: tuple[GraphInfo, ...]
    #: ``{callee graph: number of coreai.invoke of it}``
    invokes: dict[str, int]

    @property
    def invoke_count(self) -> int:
        return sum(self.invokes.values())

    def composites(self) -> Counter[str]:
        """``{composite name: call sites}``, counting invocations of composite graphs."""
        kinds = {g.name: g.composite for g in self.graphs if g.composite}
        counts: Counter[str] = Counter()
        for callee, n in self.invokes.items():
            if callee in kinds:
                counts[kinds[callee]] += n
        return counts


def summarize_ir(ir: str) -> AssetSummary:
    """Summarize the printed IR of a Core AI program."""
    graphs = []
    invokes: Counter[str] = Counter()
    for line in ir.splitlines():
        graph = _GRAPH.match(line)
        if graph:
            composite = _COMPOSITE.search(line)
            attrs = _OP_ATTRS.search(composite.group(2)) if composite else None
            graphs.append(
                GraphInfo(
                    name=graph.group(2).strip('"'),
                    noinline="noinline" in graph.group(1).split(),
                    composite=composite.group(1) if composite else None,
                    composite_attrs=attrs.group(1) if attrs else None,
                )
            )
            continue
        for callee in _INVOKE.findall(line):
            invokes[callee.strip('"')] += 1
    return AssetSummary(tuple(graphs), dict(invokes))


def asset_ir(path: str | os.PathLike) -> str:
    """The printed IR of the ``.aimodel`` at ``path``, weights elided.

    ``str(program)`` prints every weight blob in hex (over twice the weights'
    bytes, most of a summary's time at LLM scale); graphs, composite
    declarations and invocations print the same either way.
    """
    from coreai.authoring import AIModelAsset

    from coreai_partitioner._compat import program_asm

    return program_asm(AIModelAsset.load(path).program)
