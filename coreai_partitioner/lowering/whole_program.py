"""Lower a program that one Core AI delegate takes whole, partitioning before edge conversion.

``to_edge_transform_and_lower`` (ExecuTorch 1.5.1, ``exir/program/_program.py``)
converts the whole program to edge dialect before it partitions: one re-trace
to functionalize, one to decompose, one per edge ``ExportPass``.  For an LLM
decoder on a symbolic ``T`` each costs 7 to 30 s at 0.6B scale, and all of
them go to ops the delegate then takes.  :func:`lower_whole_programs` does the
same steps in another order:

1. decompose once, with the table ``to_edge_transform_and_lower`` would use
   (ExecuTorch's default minus the partitioner's ``ops_to_not_decompose``);
2. Core AI's transform passes (:func:`~coreai_partitioner.lowering.passes.get_default_passes`:
   dtype narrowing);
3. ExecuTorch's ``to_backend`` with the partitioner, on ATen IR
   (coreai-torch converts ATen programs; the backend maps edge ops back to
   ATen before converting anyway);
4. edge dialect for what stays outside the delegate.

In step 4, when what stays outside is only dtype casts around delegate calls
(an LLM decoder's int64 inputs), each cast's ATen op is swapped for its edge
op, as ExecuTorch's ``OpReplacePass`` does.  Anything else goes through
ExecuTorch's own ATen-to-edge conversion, which runs every edge pass and so
re-runs the delegate's program on fake tensors once per pass.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from executorch.exir import EdgeProgramManager
from executorch.exir.backend.backend_api import MethodProgramsPartitionerSpec, to_backend
from executorch.exir.delegate import executorch_call_delegate
from executorch.exir.graph_module import contains_any_call_fn_target_op
from executorch.exir.passes.remove_graph_asserts_pass import RemoveNonCoreAtenOpGraphAssertsPass
from executorch.exir.passes.remove_unused_parameters_pass import remove_unused_parameters_pass
from executorch.exir.passes.replace_aten_with_edge_pass import aten_to_edge
from executorch.exir.verification.verifier import EXIREdgeDialectVerifier
from torch.export import ExportedProgram

from coreai_partitioner import _compat
from coreai_partitioner.partition.boundaries import mark_outside, sizes_from_floats
from coreai_partitioner.partition.partitioner import CoreAIPartitioner
from coreai_partitioner.partition.decompositions import DECOMPOSITIONS
from coreai_partitioner.lowering.passes import get_default_compile_config, get_default_passes

logger = logging.getLogger(__name__)

#: Listed in the decomposition table, yet every trace writes them again (how a symbolic size is read).
_TRACED_BACK = (torch.ops.aten.sym_size.int,)

#: What may stay outside the delegate for the fast edge conversion: the casts around it.
_CASTS = (torch.ops.aten._to_copy.default,)


class WholeProgramManager(EdgeProgramManager):
    """An ``EdgeProgramManager`` whose ``to_executorch()`` defaults to the config its lowering needs."""

    def __init__(self, *args: Any, executorch_config: Callable[[], Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._executorch_config = executorch_config

    def default_executorch_config(self) -> Any:
        """The config ``to_executorch()`` uses when given none (a new one each time: a memory planning pass keeps
        state), or None for ExecuTorch's default."""
        return self._executorch_config() if self._executorch_config is not None else None

    def to_executorch(self, config: Any = None) -> Any:
        with bounds_kept():
            return super().to_executorch(config if config is not None else self.default_executorch_config())


@contextlib.contextmanager
def bounds_kept() -> Iterator[None]:
    """A context for ``to_executorch`` in which a bounded-dynamic size keeps its bound.

    ExecuTorch's spec propagation runs each delegate's graph on fake tensors
    whose symbolic sizes carry their example's value; a convolution there asks
    oneDNN's backend choice, which compares its sizes and narrows the bound to
    what that choice saw (a Conv1d's 512 to 320, a VITS decoder's frames 2048
    to 10), and memory is then planned for that.  With oneDNN off the choice
    compares nothing; nothing is computed here either way.  (Setting the flags
    warns about TF32 on Intel GPUs, which nothing here uses: not shown.)
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
        with torch.backends.mkldnn.flags(enabled=False):
            yield


def decomposition_table(partitioner: CoreAIPartitioner | None = None, program: ExportedProgram | None = None) -> dict:
    """The decompositions ``to_edge_transform_and_lower`` applies for ``partitioner``, and this package's
    (:mod:`coreai_partitioner.partition.decompositions`: ops coreai-torch lowers in other words).

    Core AI's partitioner keeps the same ops for every instance and program
    (those coreai-torch's table leaves whole), so both may be left out
    before there is a program.
    """
    table = _compat.default_decomposition_table()
    keep, _ = (partitioner or CoreAIPartitioner()).ops_to_not_decompose(program)
    for op in keep:
        table.pop(op, None)
    table.update(DECOMPOSITIONS)  # what coreai-torch lowers in other words (1-D interpolation, x % s)
    return table


def lower_whole_programs(
    methods: Mapping[str, tuple[ExportedProgram, CoreAIPartitioner]],
    *,
    constant_methods: Mapping[str, Any] | None = None,
    compile_config: Any = None,
    executorch_config: Callable[[], Any] | None = None,
) -> WholeProgramManager:
    """Lower each method's program with its partitioner, as ``to_edge_transform_and_lower`` does, in one
    ``to_backend`` call; the ``EdgeProgramManager`` (``.to_executorch()`` gives the ``.pte``).

    A program may be ``torch.export``'s or already decomposed with :func:`decomposition_table` (functional ATen IR
    holding none of its ops: not decomposed again).  ``compile_config`` defaults to Core AI's, which verifies the
    edge IR.  Meant for programs the delegate takes whole, where it saves every re-trace of the delegated part but
    one; it is correct for any program.  Every task reaches it through :func:`~.methods.lower_methods`.

    One call is what lets partitioners built with ``share_asset`` give their
    methods one asset (the backend's ``preprocess_multimethod`` sees them all).
    Ops the model traced under :func:`~coreai_partitioner.partition.boundaries.outside_delegate` stay outside.
    ``executorch_config`` makes the ``ExecutorchBackendConfig`` the result's
    ``to_executorch()`` uses when given none.
    """
    config = compile_config if compile_config is not None else get_default_compile_config()
    programs: dict[str, ExportedProgram] = {}
    for method, (program, partitioner) in methods.items():
        started = time.perf_counter()
        table = decomposition_table(partitioner, program)
        undecomposed = [op for op in table if op not in _TRACED_BACK]
        if program.dialect != "ATEN" or contains_any_call_fn_target_op(program.graph_module, undecomposed):
            program = program.run_decompositions(table)
        RemoveNonCoreAtenOpGraphAssertsPass()(program.graph_module)
        for transform in get_default_passes():  # the transform passes lower() runs on the edge program
            transform(program.graph_module)
        mark_outside(program.graph)
        sizes_from_floats(program.graph)
        logger.info("%s: decomposed and narrowed for Core AI in %.1f s", method, time.perf_counter() - started)
        partitioner.transform_for_pre_decomposition(program)  # the call to_edge_transform_and_lower makes
        programs[method] = program

    partitioners = {method: partitioner for method, (_, partitioner) in methods.items()}
    lowered_methods = to_backend(MethodProgramsPartitionerSpec(programs, partitioners))
    edges = {}
    for method, lowered in lowered_methods.items():
        lowered = remove_unused_parameters_pass(lowered)
        if _only_casts_outside(lowered):
            edges[method] = _casts_to_edge(lowered, config)
        else:
            logger.info("%s: ops outside the Core AI delegate: converting them with ExecuTorch's edge passes", method)
            edges[method] = _compat.aten_to_edge_program(config, lowered)
    return WholeProgramManager(
        edges, dict(constant_methods) if constant_methods else None, config, executorch_config=executorch_config
    )


def _outside_ops(program: ExportedProgram) -> list[torch.fx.Node]:
    return [
        node
        for node in program.graph.nodes
        if node.op == "call_function" and node.target not in (executorch_call_delegate, operator.getitem)
    ]


def _only_casts_outside(program: ExportedProgram) -> bool:
    return all(node.target in _CASTS and set(node.kwargs) <= {"dtype"} for node in _outside_ops(program))


def _casts_to_edge(program: ExportedProgram, config: Any) -> ExportedProgram:
    """``program`` in edge dialect: its casts' ATen ops swapped for their edge ops, in place."""
    for node in _outside_ops(program):
        node.target = aten_to_edge(node.target)
    program.graph_module.recompile()
    return _compat.rebuilt(program, verifiers=[EXIREdgeDialectVerifier(edge_compile_config=config, class_only=True)])
