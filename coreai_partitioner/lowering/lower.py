"""The common case in one call: export with composites, lower, write the ``.pte``.

    from coreai_partitioner import lower, save_pte
    lowered = lower(model, (tokens,))              # externalize_modules + to_edge_transform_and_lower
    save_pte(lowered, "model.pte")                 # to_executorch + write_to_file, atomically

Everything here is the public API composed the way the README's "Use"
section spells it out; reach for the pieces when a step needs changing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from coreai_partitioner import _compat
from coreai_partitioner._compat import ExternalizeSpec
from coreai_partitioner.records.externalize import ExternalizedModules, externalize_modules
from coreai_partitioner.partition.partitioner import CoreAIPartitioner
from coreai_partitioner.lowering.passes import get_default_compile_config, get_default_passes, remove_noop_expands
from coreai_partitioner.lowering.precision import cast_sample, check_dtype, floating_as
from coreai_partitioner.lowering.repeated import trace_repeated
from coreai_partitioner.records.specs import default_specs

#: A program ready to lower: what :func:`export_with_composites` returns.
Exported = tuple[ExportedProgram, ExternalizedModules]


def export_with_composites(
    model: torch.nn.Module,
    sample: Sequence[Any],
    *,
    specs: Sequence[type | ExternalizeSpec] | None = None,
    dynamic_shapes: Any = None,
    dtype: torch.dtype | None = None,
    quantize: Any = None,
    keep_float: Sequence[str] = (),
    decompositions: Mapping[Any, Callable[..., Any]] | None = None,
    annotations: bool = False,
    max_data_dependent_size: int | None = None,
    stack_traces: bool = True,
    repeated: str | None = None,
) -> Exported:
    """:func:`externalize_modules` with ``torch.export`` and coreai-torch's decompositions.

    ``specs`` defaults to :func:`default_specs`; ``dynamic_shapes`` is
    ``torch.export.export``'s.  ``dtype`` exports the model's floating weights,
    buffers and sample in that dtype (the model itself is left as it is;
    :mod:`.precision`).  ``quantize`` (a scheme of
    :data:`coreai_partitioner.quantize.schemes.SCHEMES`: ``"int8"``, ``"int4"``,
    ``"int4-channel"``, ``"palettize4"``, ``"palettize8"``,
    ``"palettize4-mixed"``; a :class:`~coreai_partitioner.quantize.schemes.Scheme`; or a
    coreai-opt ``QuantizerConfig``) stores the weights outside the composites
    compressed with :func:`coreai_partitioner.quantize.quantize`, leaving
    ``keep_float`` layers in floating point.  Returns the program and its records.

    ``decompositions`` (:func:`~.whole_program.decomposition_table`'s, for a
    program :func:`~.whole_program.lower_whole_programs` lowers) traces the
    model straight to functional ATen IR with that table, one trace where
    export and ``run_decompositions`` make two (an ``int`` scheme, which
    finds its Linear layers before decomposition, exports first), and drops
    the no-op ``expand`` calls Core AI specializes wrongly
    (:func:`~.passes.remove_noop_expands`).  ``annotations`` keeps the
    delegate boundaries the model's code marks (:mod:`coreai_partitioner.partition.boundaries`).

    A size known only when the program runs (``nonzero``'s count, an
    ``item()``, VITS's frame count) needs a largest value: ExecuTorch plans
    memory for it.  ``torch._check(n <= N)`` in the model gives one;
    ``max_data_dependent_size=N`` gives every such size without one that
    bound (a run that exceeds it fails in ExecuTorch's resize).  A size
    with neither is refused here, naming the node that makes it.

    ``stack_traces=False`` traces without recording each node's Python stack
    (``node.meta["stack_trace"]``): a sixth of a 0.6B decoder's export, and
    read only by an asset with ``debug_info="full"`` and by an ETRecord
    (:func:`reads_stack_traces`).

    ``repeated`` names a ``ModuleList`` of ``model`` whose layers the code
    around it treats alike (no layer's index read outside it): its first
    layers are traced and the rest written into the graph as copies of the
    last one traced, where the layers are shown alike
    (:mod:`~.repeated`; the program is the whole trace's, node for node).
    """
    from coreai_partitioner.partition.decompositions import coreai_table

    if dtype is not None:
        check_dtype(dtype)
    if quantize is not None:
        _check_quantize(quantize)
    sample = tuple(sample) if dtype is None else cast_sample(sample, dtype)
    traced_decomposed = decompositions is not None and not (quantize is not None and _needs_linear_ops(quantize))
    keep_marks = _compat.preserve_node_meta if annotations else contextlib.nullcontext

    def trace(module: torch.nn.Module) -> ExportedProgram:
        with torch.no_grad(), keep_marks():
            if traced_decomposed:
                return _compat.export_decomposed(module, sample, dynamic_shapes, decompositions)
            return torch.export.export(module, sample, dynamic_shapes=dynamic_shapes)

    def export_fn(module: torch.nn.Module) -> ExportedProgram:
        program = trace(module) if repeated is None else trace_repeated(module, repeated, trace)
        if quantize is not None or decompositions is not None:
            return program  # quantize() decomposes, with the table given
        return program.run_decompositions(coreai_table())

    with _compat.stack_traces_recorded(stack_traces):
        with floating_as(model, dtype):
            program, records = externalize_modules(model, default_specs() if specs is None else specs, export_fn=export_fn)
        if quantize is not None:
            from coreai_partitioner.quantize import quantize as quantize_weights

            program = quantize_weights(
                program, quantize, records=records, example_inputs=sample, dynamic_shapes=dynamic_shapes,
                keep_float=keep_float, decompositions=decompositions,
            )
        elif decompositions is not None and not traced_decomposed:
            program = program.run_decompositions(decompositions)
    if decompositions is not None:
        for graph_module in [program.graph_module, *(record.exported_program.graph_module for record in records)]:
            remove_noop_expands(graph_module)
    _compat.return_types_as_tuples(program)
    bound_data_dependent_sizes(program, max_data_dependent_size)
    return program, records


def reads_stack_traces(partitioner_options: Mapping[str, Any], generate_etrecord: bool = False) -> bool:
    """Whether anything the lowering makes reads the trace's stack traces: the asset with
    ``debug_info="full"`` (:mod:`coreai_partitioner.backends.apple_coreai.debug_info`), or an ETRecord."""
    from coreai_partitioner.backends.apple_coreai.debug_info import DEFAULT

    return generate_etrecord or partitioner_options.get("debug_info", DEFAULT) == "full"


def bound_data_dependent_sizes(program: ExportedProgram, largest: int | None) -> None:
    """Bound each data-dependent size of ``program`` that has no largest value by ``largest``, or refuse it."""
    if largest is not None:
        if not isinstance(largest, int) or isinstance(largest, bool) or largest < 1:
            raise ValueError(f"max_data_dependent_size={largest!r}: give a positive int, the largest such size")
        _compat.bound_data_dependent_sizes(program, largest)
        return
    unbounded = _compat.unbounded_data_dependent_sizes(program)
    if unbounded:
        symbol, node = next(iter(unbounded.items()))
        raise ValueError(
            f"the size {symbol} made by node {node!r} is known only when the program runs and has no largest value; "
            "ExecuTorch plans memory for the largest size: bound it in the model with torch._check(n <= N), "
            "or pass max_data_dependent_size=N"
        )


def _needs_linear_ops(scheme: Any) -> bool:
    from coreai_partitioner.quantize import needs_linear_ops

    return needs_linear_ops(scheme)


def _check_quantize(scheme: Any) -> None:
    import importlib.util

    from coreai_partitioner.quantize.schemes import SCHEMES, Scheme

    if isinstance(scheme, str) and scheme not in SCHEMES:
        raise ValueError(
            f"quantize={scheme!r} is not a scheme; choose one of {', '.join(map(repr, SCHEMES))}, "
            "or pass a coreai_opt.quantization.QuantizerConfig"
        )
    if not isinstance(scheme, (str, Scheme)) and importlib.util.find_spec("coreai_opt") is None:
        raise ValueError(f"quantize={scheme!r} needs coreai-opt: pip install 'coreai-partitioner[quantize]'")


def lower_exported(
    programs: Exported | Mapping[str, Exported],
    *,
    transform: Callable[[ExportedProgram], ExportedProgram] | None = None,
    constant_methods: Mapping[str, Any] | None = None,
    generate_etrecord: bool = False,
    **partitioner_options: Any,
) -> Any:
    """``to_edge_transform_and_lower`` with one :class:`CoreAIPartitioner` per method.

    ``programs`` is one ``(program, records)`` pair (the method ``forward``)
    or ``{method: (program, records)}``.  ``transform`` runs on each program
    before lowering (quantization, say); records stay valid, since call sites
    are found by op target.  ``generate_etrecord`` is ExecuTorch's: the
    ``to_executorch()`` result's ``get_etrecord()`` returns it (it holds
    copies of the programs, weights included).  Returns the ``EdgeProgramManager``.
    """
    from executorch.exir import to_edge_transform_and_lower

    if isinstance(programs, tuple):
        programs = {"forward": programs}
    exported = {name: program for name, (program, _) in programs.items()}
    if transform is not None:
        exported = {name: transform(program) for name, program in exported.items()}
    return to_edge_transform_and_lower(
        exported,
        partitioner={
            name: [CoreAIPartitioner(externalized_modules=records, **partitioner_options)]
            for name, (_, records) in programs.items()
        },
        compile_config=get_default_compile_config(),
        transform_passes=get_default_passes(),
        constant_methods=dict(constant_methods) if constant_methods else None,
        generate_etrecord=generate_etrecord,
    )


def lower(
    model: torch.nn.Module,
    sample: Sequence[Any],
    *,
    specs: Sequence[type | ExternalizeSpec] | None = None,
    dynamic_shapes: Any = None,
    dtype: torch.dtype | None = None,
    quantize: Any = None,
    keep_float: Sequence[str] = (),
    transform: Callable[[ExportedProgram], ExportedProgram] | None = None,
    constant_methods: Mapping[str, Any] | None = None,
    generate_etrecord: bool = False,
    max_data_dependent_size: int | None = None,
    **partitioner_options: Any,
) -> Any:
    """Export ``model`` on ``sample`` with its composites and lower it for Core AI.

    :func:`export_with_composites` (``dtype``, ``quantize``) then
    :func:`lower_exported`; the options of both, and every
    :class:`CoreAIPartitioner` option.  Returns the ``EdgeProgramManager``
    (``.to_executorch()``, or :func:`save_pte`).
    """
    exported = export_with_composites(
        model, sample, specs=specs, dynamic_shapes=dynamic_shapes, dtype=dtype, quantize=quantize, keep_float=keep_float,
        max_data_dependent_size=max_data_dependent_size,
        stack_traces=reads_stack_traces(partitioner_options, generate_etrecord),
    )
    return lower_exported(
        exported,
        transform=transform,
        constant_methods=constant_methods,
        generate_etrecord=generate_etrecord,
        **partitioner_options,
    )


def save_pte(lowered: Any, path: str | os.PathLike) -> Path:
    """Write the ``.pte`` of ``lowered`` (an ``EdgeProgramManager`` or its ``to_executorch()``), and its ``.ptd``.

    A program lowered with ``external_data=True`` keeps its weights in a data
    file, written beside the ``.pte`` with its name (``model.pte``,
    ``model.ptd``; :mod:`.external_data`).  Streams with ``write_to_file``
    (``program.buffer`` would hold one more copy of the weights in memory)
    into temporary files beside ``path``, renamed into place once complete:
    a failure never leaves a half-written ``.pte``.  Returns the path.
    """
    from coreai_partitioner.lowering.external_data import write_program

    write_program(to_executorch(lowered), path)
    return Path(path)


def to_executorch(lowered: Any, config: Any = None, *, kept: Sequence[str] = ()) -> Any:
    """``lowered.to_executorch(config)``, whose constants outside the delegates follow the delegates' data file.

    ``kept`` names constant placeholders that stay in the ``.pte`` all the same
    (an adapter's pairs).  ``lowered`` already serialized (an
    ``ExecutorchProgramManager``) is returned as it is.
    """
    from coreai_partitioner.lowering.external_data import executorch_config, external_data_tags
    from coreai_partitioner.lowering.whole_program import bounds_kept

    if not hasattr(lowered, "to_executorch"):
        return lowered
    tags = external_data_tags(lowered)
    if tags:
        if config is None and hasattr(lowered, "default_executorch_config"):
            config = lowered.default_executorch_config()
        config = executorch_config(config, tag=next(iter(sorted(tags))), kept=kept)
    with bounds_kept():  # lower()'s program too: a bounded length through a convolution keeps its bound
        return lowered.to_executorch(config)
