"""The tail every task's export ends with: its methods lowered in one call, each a function of one shared asset.

A task (an LLM's device form, a vision-language model's three methods, a
speech model's two) exports each method to a program and the records of its
composites; :func:`lower_methods` gives each a partitioner that asks for the
one asset (``share_asset``: each weight stored once in the ``.pte``), lowers
them together (:func:`~.whole_program.lower_whole_programs`) with the task's
constant methods, and, for the form upstream's on-device runtime runs, relabels
the delegates and holds them to that runtime's contract (:mod:`.device`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from coreai_partitioner import _compat
from coreai_partitioner.lowering.device import check_delegates, executorch_config, relabel_backend
from coreai_partitioner.lowering.whole_program import lower_whole_programs
from coreai_partitioner.partition.partitioner import CoreAIPartitioner

#: Partitioner options :func:`lower_methods` sets itself: one inline asset, a function per method, and the caches
#: as delegate state (host form) or as ExecuTorch's mutable buffers (device form).
SET_HERE = frozenset({"share_asset", "uses_sidecar", "input_enumerations", "take_over_mutable_buffer"})


def lower_methods(
    exported: Iterable[tuple[str, tuple[ExportedProgram, Sequence[Any]]]],
    *,
    device: bool,
    constant_methods: Mapping[str, Any],
    bounded: int | None = None,
    **partitioner_options: Any,
):
    """Each ``(method, (program, records))`` of ``exported`` lowered in one ``to_backend`` call to one Core AI asset;
    the ``EdgeProgramManager``.  ``exported`` is read after the options are checked: a generator that exports each
    method does no work for a call refused here.

    ``device`` makes the form upstream's on-device runtime runs: caches left
    to ExecuTorch, backend id ``CoreAIBackend``, every delegate checked against
    the runtime's contract (``bounded``: the upper bound of a bounded-dynamic
    dimension it may take).  ``partitioner_options`` go to each
    :class:`~coreai_partitioner.partition.partitioner.CoreAIPartitioner`; those in :data:`SET_HERE`
    are refused.
    """
    refused = SET_HERE & set(partitioner_options)
    if refused:
        form = "the device form" if device else "a lowering to one shared asset"
        raise ValueError(
            f"{form} sets {', '.join(sorted(refused))} itself (one inline asset, a function per method); leave them out"
        )
    methods = {
        method: (
            program,
            CoreAIPartitioner(
                externalized_modules=records, take_over_mutable_buffer=not device, share_asset=True, **partitioner_options
            ),
        )
        for method, (program, records) in exported
    }
    # The programs are ours and their .pte is checked end to end: no ExecuTorch IR re-verification.
    with torch.no_grad():
        edge = lower_whole_programs(
            methods,
            constant_methods=constant_methods,
            compile_config=_compat.unverified_compile_config(),
            executorch_config=executorch_config if device else None,
        )
    if device:
        relabel_backend(edge)
        check_delegates(edge, bounded=bounded)
    return edge
