"""Palettization of an exported program's weights: look-up tables by k-means, expanded by ``coreai::lut_to_dense``.

Where it goes in the flow (:func:`coreai_partitioner.quantize.quantize` calls
it for the ``palettize*`` schemes)::

    ep, records = externalize_modules(model, default_specs(), export_fn=...)   # decomposed or not
    ep = palettize(ep, "palettize4", records=records)
    lowered = lower_exported((ep, records))

Every floating weight of rank 2 and up that an op outside the composites
reads (:func:`~.program_weights.outside_composites`) is stored as the
scheme's form: embeddings (a tied lm_head is the same tensor) as
``scheme.embedding``, every other weight as ``scheme.linear``, each along its
first axis (a Linear's output channels, an embedding's rows), unless
``keep_float`` names it.  Composite bodies never see a table: a weight a
composite reads is its operand, expanded before the call.  Every shape is
checked before any k-means (:func:`~.schemes.check_fits`).  A mixed scheme
clusters every Linear weight at 4 bits, then re-clusters at 8 bits the ones
whose tables fit worst (largest relative squared error), up to
``scheme.promoted_share`` of those weights.

The program is rewritten, not re-exported (:func:`~.program_weights.replace_weights`),
so it may be the decomposed program ``lower`` and ``text_generation.lower_decoder``
export in one trace, and whatever form it was lowered for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.export import ExportedProgram

from coreai_partitioner.quantize import schemes
from coreai_partitioner.quantize.checks import planned_weights as planned  # what palettize stores: the public name
from coreai_partitioner.quantize.store import store_weights

__all__ = ["palettize", "planned"]


def palettize(
    program: ExportedProgram,
    scheme: str | schemes.Scheme = "palettize4",
    *,
    records: Sequence[Any] | None = None,
    keep_float: Sequence[str] = (),
    group_size: int | None = None,
) -> ExportedProgram:
    """``program`` with its weights outside the composites stored as look-up tables; ``program`` is left as it was.

    ``scheme`` is a ``palettize*`` name of :data:`~.schemes.SCHEMES` or a
    :class:`~.schemes.Scheme` of look-up tables; ``group_size`` changes its
    groups of output channels.  ``records`` (``externalize_modules``') are
    checked to still pair with the call sites.  Raises
    :class:`~.schemes.QuantizationError` naming every weight the scheme cannot
    store, before any k-means.
    """
    scheme = schemes.scheme(scheme, group_size=group_size)
    if not scheme.palettized:
        raise ValueError(f"{scheme.name} is not a palettization scheme; quantize() takes it")
    return store_weights(program, scheme, records=records, keep_float=keep_float)
