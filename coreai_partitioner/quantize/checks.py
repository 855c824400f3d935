"""Every weight a scheme will store fits it, and quantization keeps every composite call site: checked before any work, and after.

:func:`check_model` reads a model (a meta-device one too) before anything is
exported; :func:`check_int_shapes` an exported program before coreai-opt
runs; :func:`check_call_sites` the program after quantization.  Each error
names the layer and the ways out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from coreai_partitioner.quantize import schemes
from coreai_partitioner.quantize.program_weights import is_kept, outside_composites
from coreai_partitioner.quantize.schemes import QuantizationError, Scheme
from coreai_partitioner.records.call_sites import call_sites_by_op, resolve_call_sites

def check_model(
    model: torch.nn.Module,
    scheme: str | Scheme,
    *,
    keep_float: Sequence[str] = (),
    planned: Sequence[schemes.Planned] = (),
) -> None:
    """Before any export: raise naming every weight of ``model`` the scheme cannot store, and the ways out.

    The weights are those of its Linear, convolution and embedding modules,
    those a module storing its own says it stores (``module.planned(scheme,
    path)``, a list of :class:`~.schemes.Planned`: MoE experts), and
    ``planned``.  Works on a meta-device model (shapes only).  A Linear whose
    weight is an embedding's (a tied lm_head) takes the embedding's form.
    """
    found = schemes.scheme(scheme)
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    names: dict[int, list[str]] = {}
    tensors = {}
    weights = list(planned)
    for layer, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, _STORED) and isinstance(weight, torch.Tensor):
            names.setdefault(id(weight), []).append(layer)
            tensors[id(weight)] = weight
        elif callable(getattr(module, "planned", None)) and not is_kept(layer, layer, keep_float):
            weights += module.planned(found, layer)
    for key, layers in names.items():
        if any(is_kept(f"{layer}.weight", layer, keep_float) for layer in layers):
            continue
        form = found.embedding if key in embedded else found.linear
        weights.append(schemes.Planned(f"{layers[0]}.weight", layers[0], tuple(tensors[key].shape), form))
    schemes.check_fits(weights, found.name)


#: Modules whose weight every scheme stores.
_STORED = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d)


def check_int_shapes(exported_program: ExportedProgram, scheme: Scheme, keep_float: Sequence[str]) -> None:
    """Every weight coreai-opt will quantize fits the scheme's form (int4 blocks divide its input channels)."""
    planned = [
        schemes.Planned(w.name, w.layer, w.shape, scheme.embedding if w.is_embedding else scheme.linear)
        for w in outside_composites(exported_program).values()
        if not w.is_kept(keep_float)
    ]
    schemes.check_fits(planned, scheme.name)


def check_call_sites(before: ExportedProgram, after: ExportedProgram, records: Sequence[Any] | None) -> None:
    """Quantization kept every composite call site, and the records still pair with them."""
    counts_before = {op: len(n) for op, n in call_sites_by_op(before.graph).items()}
    counts_after = {op: len(n) for op, n in call_sites_by_op(after.graph).items()}
    if counts_before != counts_after:
        changed = sorted(op for op in counts_before.keys() | counts_after.keys() if counts_before.get(op) != counts_after.get(op))
        raise QuantizationError(f"quantization changed the composite call sites of {', '.join(changed)}")
    if records is None:
        return
    resolution = resolve_call_sites(records, [after.graph, *(r.exported_program.graph for r in records)])
    if resolution.mismatches:
        raise QuantizationError("; ".join(str(m) for m in resolution.mismatches))
