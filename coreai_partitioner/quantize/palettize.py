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
so it may be the decomposed program ``lower`` and ``llm.lower_decoder``
export in one trace, and whatever form it was lowered for.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from torch.export import ExportedProgram

from coreai_partitioner.quantize import program_weights, schemes
from coreai_partitioner.quantize.checks import check_call_sites
from coreai_partitioner.quantize.checks import planned_weights as planned  # what palettize stores: the public name
from coreai_partitioner.quantize.weight_forms import Compressed, compress

logger = logging.getLogger(__name__)

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
    weights = planned(program, scheme, keep_float)
    schemes.check_fits(weights, scheme.name)
    started = time.perf_counter()
    compressed = {w.name: compress(program.state_dict[w.name], w.form, axis=w.axis) for w in weights}
    if scheme.promoted is not None:
        compressed.update(_promoted(program, weights, compressed, scheme))
    logger.info(
        "palettized %d weight(s) (%s) in %.1f s, %d at %d bits",
        len(compressed), scheme.name, time.perf_counter() - started,
        sum(c.form.bits == 8 for c in compressed.values()), 8,
    )
    result = program_weights.replace_weights(program, compressed)
    check_call_sites(program, result, records)
    return result


def _promoted(
    program: ExportedProgram, weights: list[schemes.Planned], compressed: dict[str, Compressed], scheme: schemes.Scheme
) -> dict[str, Compressed]:
    """The Linear weights 4-bit tables fit worst, re-clustered as ``scheme.promoted``, up to its share of them."""
    linear = [w for w in weights if w.form == scheme.linear]
    budget = scheme.promoted_share * sum(math.prod(w.shape) for w in linear)
    promoted, used = {}, 0
    for w in sorted(linear, key=lambda w: compressed[w.name].error, reverse=True):
        if used + math.prod(w.shape) > budget:
            continue
        used += math.prod(w.shape)
        promoted[w.name] = compress(program.state_dict[w.name], scheme.promoted, axis=w.axis)
    return promoted
