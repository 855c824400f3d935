"""Every weight a scheme will store fits it, and quantization keeps every composite call site: checked before any work, and after.

:func:`stored_weights` lists what a scheme stores of a model (a meta-device
one too) before anything is exported, :func:`planned_weights` of an exported
program; :func:`check_model` refuses a model's misfits, naming each layer and
the ways out.  :func:`keep_unstorable_float` is the other way: the layers a
scheme cannot store stay float, said in one warning (:func:`coreai_partitioner.quantize.quantize`
takes it for every model, the VLM export for its vision tower).
:func:`check_call_sites` checks the program after quantization.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from coreai_partitioner.quantize import schemes
from coreai_partitioner.quantize.program_weights import is_kept, outside_composites
from coreai_partitioner.quantize.schemes import QuantizationError, Scheme
from coreai_partitioner.records.call_sites import call_sites_by_op, resolve_call_sites

#: Modules whose weight every scheme stores.
_STORED = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d)


def stored_weights(
    model: torch.nn.Module,
    scheme: str | Scheme,
    *,
    keep_float: Sequence[str] = (),
    planned: Sequence[schemes.Planned] = (),
) -> list[schemes.Planned]:
    """What ``scheme`` stores of ``model``, before any export: its Linear, convolution and embedding weights,
    those a module storing its own says it stores (``module.planned(scheme, path)``, a list of
    :class:`~.schemes.Planned`: MoE experts), and ``planned``; none ``keep_float`` names.  Shapes only (a
    meta-device model too).  A Linear whose weight is an embedding's (a tied lm_head) takes the embedding's form."""
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
        if any(is_kept(_weight_name(layer), layer, keep_float) for layer in layers):
            continue
        form = found.embedding if key in embedded else found.linear
        weights.append(schemes.Planned(_weight_name(layers[0]), layers[0], tuple(tensors[key].shape), form))
    return weights


def _weight_name(layer: str) -> str:
    return f"{layer}.weight" if layer else "weight"


def check_model(
    model: torch.nn.Module,
    scheme: str | Scheme,
    *,
    keep_float: Sequence[str] = (),
    planned: Sequence[schemes.Planned] = (),
) -> None:
    """Before any export: raise naming every weight of ``model`` the scheme cannot store, and the ways out
    (:func:`stored_weights` are the weights)."""
    schemes.check_fits(stored_weights(model, scheme, keep_float=keep_float, planned=planned), schemes.scheme(scheme).name)


def planned_weights(program: ExportedProgram, scheme: Scheme, keep_float: Sequence[str] = ()) -> list[schemes.Planned]:
    """Every weight ``scheme`` stores in ``program`` (those ops outside the composites read), with its form; none
    ``keep_float`` names."""
    return [
        schemes.Planned(w.name, w.layer, w.shape, scheme.embedding if w.is_embedding else scheme.linear, inputs=w.inputs)
        for w in outside_composites(program).values()
        if not w.is_kept(keep_float)
    ]


def keep_unstorable_float(
    planned: Sequence[schemes.Planned], scheme_name: str, *, model: str = "", part: str = "", stacklevel: int = 2
) -> list[str]:
    """The layers of ``planned`` their forms cannot store (a 3-channel stem convolution under ``int4``, 16
    output channels under a table per 32), to keep in floating point; one warning names each, why, and the
    scheme (``model``, ``part``: whose layers they are, for its text).  ``[]``, and no warning, when all fit."""
    unstorable = schemes.misfits(planned)
    if not unstorable:
        return []
    layers = list(dict.fromkeys(p.layer or p.name for p, _ in unstorable))
    why = {}
    for p, reason in unstorable:
        why.setdefault(p.layer or p.name, f"{list(p.shape)} as {p.form}: {reason}")
    warnings.warn(
        f"{model + ': ' if model else ''}the {scheme_name} scheme cannot store {len(layers)} layer(s)"
        f"{' of ' + part if part else ''}, kept float: " + "; ".join(f"{layer} ({why[layer]})" for layer in layers),
        stacklevel=stacklevel + 1,
    )
    return layers


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
