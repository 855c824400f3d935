"""A scheme's weights stored compressed, one tensor at a time: every ``quantize=`` scheme of :data:`~.schemes.SCHEMES`.

Every floating weight of rank 2 and up that an op outside the composites
reads (:func:`~.program_weights.outside_composites`) is stored as the
scheme's form (:func:`~.weight_forms.compress`): embeddings (a tied lm_head
is the same tensor) as ``scheme.embedding``, every other weight as
``scheme.linear``, unless ``keep_float`` names it.  Every shape is checked
before any work (:func:`~.schemes.check_fits`).  The program is rewritten,
not re-exported (:func:`~.program_weights.replace_weights`); composite bodies
never see a compressed weight (a weight a composite reads is its operand,
expanded before the call).

The ``int`` schemes give coreai-opt's weights bit for bit (its symmetric
scales and rounding: :func:`~.weight_forms.compress`) without its graph-mode
quantizer, whose pattern matching costs tens of seconds a process whatever the
model.  Like it they store the weights of Linear, convolution and embedding
layers, found by their ``aten.linear`` / ``aten.conv*`` / ``aten.embedding``
ops (a program before ``run_decompositions``); a weight another op reads is an
error naming it.  Unlike it they leave a BatchNorm after a convolution as it
is, where coreai-opt folds it into the convolution's weight first: a scale per
output channel takes BatchNorm's factor per output channel exactly, so both
store the same integers up to the rounding of the fold.

The ``palettize*`` schemes store any weight as look-up tables (the program
may be decomposed already); a mixed scheme clusters every Linear weight at 4
bits, then re-clusters at 8 bits the ones whose tables fit worst (largest
relative squared error), up to ``scheme.promoted_share`` of those weights.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from coreai_partitioner import checkpoints
from coreai_partitioner.quantize import program_weights, schemes
from coreai_partitioner.quantize.checks import check_call_sites, planned_weights
from coreai_partitioner.quantize.schemes import QuantizationError
from coreai_partitioner.quantize.weight_forms import Compressed, compress

logger = logging.getLogger(__name__)

__all__ = ["store_weights"]

#: The ops whose weights the ``int`` schemes store (coreai-opt's): Linear, convolution, embedding.
INT_READERS = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
               "convolution", "embedding")


def store_weights(
    program: ExportedProgram, scheme: schemes.Scheme, *, records: Sequence[Any] | None = None, keep_float: Sequence[str] = ()
) -> ExportedProgram:
    """``program`` with its weights outside the composites stored as ``scheme`` says; ``program`` is left as it was.

    ``records`` (``externalize_modules``') are checked to still pair with the
    call sites.  Raises :class:`~.schemes.QuantizationError` naming every weight
    the scheme cannot store, before any work.
    """
    weights = planned_weights(program, scheme, keep_float)
    schemes.check_fits(weights, scheme.name)
    if not scheme.palettized:
        _check_int_readers(program, keep_float)
    started = time.perf_counter()
    ranked = scheme.promoted is not None  # a mixed scheme promotes the weights its tables fit worst
    compressed = {w.name: _compress(program.state_dict[w.name], w, ranked) for w in weights}
    if ranked:
        compressed.update(_promoted(program, weights, compressed, scheme))
    logger.info(
        "stored %d weight(s) as %s in %.1f s%s", len(compressed), scheme.name, time.perf_counter() - started,
        f", {sum(c.form == scheme.promoted for c in compressed.values())} promoted" if scheme.promoted else "",
    )
    result = program_weights.replace_weights(program, compressed)
    checkpoints.materialize_program(result)  # a streamed weight the scheme does not store here (a router read by mm)
    check_call_sites(program, result, records)
    return result


def _compress(weight: torch.Tensor, planned: schemes.Planned, error: bool) -> Compressed:
    """``weight`` as ``planned.form`` (its table's squared error measured if ``error``); a transposed convolution's
    ``[in, out / groups, *kernel]`` with an integer scale per output channel (axis 1) or per block of input channels
    (axis 0), as coreai-opt places them.  A weight :mod:`coreai_partitioner.checkpoints` left in the checkpoint is read now (an ``int``
    form's a few rows at a time), and dropped once compressed."""
    if planned.form.kind == "int" and planned.inputs == 0:
        return compress(checkpoints.materialize(weight).transpose(0, 1), planned.form).transpose(0, 1)
    read = checkpoints.row_reader(weight) if planned.form.kind == "int" else None  # a few rows at a time
    return compress(
        weight if read else checkpoints.materialize(weight), planned.form, axis=planned.axis, read=read, error=error
    )


def _check_int_readers(program: ExportedProgram, keep_float: Sequence[str]) -> None:
    """Every weight an ``int`` scheme stores is read by a Linear, convolution or embedding op."""
    missed = [
        w for w in program_weights.outside_composites(program).values()
        if not w.is_kept(keep_float) and any(op.partition(".")[0] not in INT_READERS for op in w.ops)
    ]
    if not missed:
        return
    listed = "; ".join(f"{w.name} (read by {', '.join(w.ops)})" for w in missed)
    raise QuantizationError(
        f"{len(missed)} weight(s) are read by ops the int schemes do not quantize: {listed}. They store Linear, "
        "Conv and Embedding layers exported as aten.linear / aten.conv / aten.embedding (quantize before "
        f"run_decompositions, which turns linear into mm). Pass keep_float=[{', '.join(repr(w.layer or w.name) for w in missed)}] "
        "to keep them float, or use a palettize scheme, which stores any weight."
    )


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
        promoted[w.name] = compress(checkpoints.materialize(program.state_dict[w.name]), scheme.promoted, axis=w.axis)
    return promoted
