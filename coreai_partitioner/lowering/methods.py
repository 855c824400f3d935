"""The tail every task's export ends with: its methods lowered in one call, each a function of one shared asset.

A task (an LLM's one or two methods, a vision-language model's three, a
speech model's two, an encoder's or a classifier's ``forward``) exports each method to a program and the records of its
composites; :func:`lower_methods` gives each a partitioner that asks for the
one asset (``share_asset``: each weight stored once in the ``.pte``), lowers
them together (:func:`~.whole_program.lower_whole_programs`) with the task's
constant methods, and, for the form upstream's on-device runtime runs, relabels
the delegates and holds them to that runtime's contract (:mod:`.device`).
:func:`lower_method_modules` is the whole road for a task whose methods are
modules: each exported (:func:`export_method`), then :func:`lower_methods`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from coreai_partitioner.lowering.passes import get_default_compile_config
from coreai_partitioner.lowering.device import check_delegates, executorch_config, relabel_backend
from coreai_partitioner.lowering.whole_program import decomposition_table, lower_whole_programs
from coreai_partitioner.partition.partitioner import CoreAIPartitioner

logger = logging.getLogger(__name__)

#: Partitioner options :func:`lower_methods` sets itself: one inline asset, a function per method, and the caches
#: as delegate state (host form) or as ExecuTorch's mutable buffers (device form).  ``input_enumerations`` is its
#: own keyword: one method's (a function of the asset per shape).
SET_HERE = frozenset({"share_asset", "uses_sidecar", "take_over_mutable_buffer"})


def lower_methods(
    exported: Iterable[tuple[str, tuple[ExportedProgram, Sequence[Any]]]],
    *,
    device: bool,
    constant_methods: Mapping[str, Any],
    bounded: int | None = None,
    check: bool = True,
    input_enumerations: Any = None,
    **partitioner_options: Any,
):
    """Each ``(method, (program, records))`` of ``exported`` lowered in one ``to_backend`` call to one Core AI asset;
    the ``EdgeProgramManager``.  ``exported`` is read after the options are checked: a generator that exports each
    method does no work for a call refused here.

    ``device`` makes the form upstream's on-device runtime runs: caches left
    to ExecuTorch, backend id ``CoreAIBackend``, every delegate checked against
    the runtime's contract (``bounded``: the upper bound of a bounded-dynamic
    dimension it may take; ``check=False`` leaves that to the caller, whose programs bind symbolic inputs later).
    ``input_enumerations`` gives the one method of ``exported`` a statically shaped function per enumerated shape
    (an LLM's host form, ``DecoderShapes.mode == "enumerated"``): the asset is that method's own, its functions the
    shapes; it is refused beside a second method.
    ``partitioner_options`` go to each
    :class:`~coreai_partitioner.partition.partitioner.CoreAIPartitioner`; those in :data:`SET_HERE`
    are refused.
    """
    refused = SET_HERE & set(partitioner_options)
    if refused:
        form = "the device form" if device else "a lowering to one shared asset"
        raise ValueError(
            f"{form} sets {', '.join(sorted(refused))} itself (one inline asset, a function per method); leave them out"
        )
    if input_enumerations is not None:
        partitioner_options = {**partitioner_options, "input_enumerations": input_enumerations}
    methods = {}
    for method, (program, records) in exported:
        if input_enumerations is not None and methods:
            raise ValueError(
                f"input_enumerations with the methods {', '.join(methods)} and {method}: a shared asset's functions are "
                "the methods themselves; give each method its own static shapes instead"
            )
        methods[method] = (
            program,
            CoreAIPartitioner(
                externalized_modules=records,
                take_over_mutable_buffer=not device,
                share_asset=input_enumerations is None,  # else the asset's functions are the method's shapes
                **partitioner_options,
            ),
        )
    with torch.no_grad():
        edge = lower_whole_programs(
            methods,
            constant_methods=constant_methods,
            compile_config=get_default_compile_config(),
            executorch_config=executorch_config if device else None,
        )
    if device:
        relabel_backend(edge)
        if check:
            check_delegates(edge, bounded=bounded)
    return edge


def export_method(
    module: torch.nn.Module, sample: Sequence[torch.Tensor], decompositions: dict, dynamic_shapes: Any = None,
    quantize: Any = None, stack_traces: bool = True,
):
    """``module`` exported to functional ATen IR with its composites externalized (the export road every task
    takes, :func:`~coreai_partitioner.lowering.lower.export_with_composites`), its weights stored as ``quantize``
    (a scheme, or ``None``) says; ``(program, records)``.

    The trace keeps the boundaries the model marks
    (:func:`~coreai_partitioner.partition.boundaries.outside_delegate`: the
    cross-attention split, the device form's cache writes), and each node's stack trace only with ``stack_traces``.
    """
    from coreai_partitioner.lowering.lower import export_with_composites

    with torch.no_grad():
        return export_with_composites(
            module, sample, dynamic_shapes=dynamic_shapes, decompositions=decompositions, annotations=True,
            quantize=quantize, stack_traces=stack_traces,
        )


def lower_method_modules(
    modules: Mapping[str, torch.nn.Module],
    samples: Mapping[str, Sequence[torch.Tensor]],
    *,
    device: bool,
    constant_methods: Mapping[str, Any],
    dynamic_shapes: Mapping[str, Any] | None = None,
    bounded: int | None = None,
    phases: dict[str, float] | None = None,
    quantize: Any = None,
    quantized_reference: dict[str, Any] | None = None,
    **partitioner_options: Any,
):
    """Each of ``modules`` (by method) exported on its ``samples`` (:func:`export_method`, with its
    ``dynamic_shapes`` where given, its weights stored as ``quantize`` says; a dict passed as
    ``quantized_reference`` receives each method's quantized eager module, whose weights are the ones the program
    stores), all lowered by :func:`lower_methods` (``device``, ``constant_methods``,
    ``bounded`` and ``partitioner_options`` are its); the ``EdgeProgramManager``.

    ``phases``, when given, receives the seconds of each phase (``export <method>``, ``lower``).
    """
    from coreai_partitioner.lowering.lower import reads_stack_traces

    phases = phases if phases is not None else {}
    dynamic_shapes = dynamic_shapes or {}
    stack_traces = reads_stack_traces(partitioner_options)  # the trace records none that nothing reads

    def exported():
        table = decomposition_table()
        for method, module in modules.items():
            started = time.perf_counter()
            program, records = export_method(
                module, samples[method], table, dynamic_shapes.get(method), quantize, stack_traces
            )
            if quantize is not None and quantized_reference is not None:
                quantized_reference[method] = program.module()
            yield method, (program, records)
            phases[f"export {method}"] = time.perf_counter() - started
            logger.info("%s: exported in %.1f s", method, phases[f"export {method}"])

    started = time.perf_counter()
    edge = lower_methods(exported(), device=device, constant_methods=constant_methods, bounded=bounded, **partitioner_options)
    phases["lower"] = time.perf_counter() - started - sum(phases[f"export {method}"] for method in modules)
    return edge
