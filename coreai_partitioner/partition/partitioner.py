"""``CoreAIPartitioner``: upstream's partitioner, claiming externalized call sites too."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, PartitionResult
from executorch.exir.backend.utils import tag_constant_data, tag_mutated_buffer
from torch.export import ExportedProgram
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

from coreai_partitioner import _compat
from coreai_partitioner.backends.apple_coreai import BACKEND_ID
from coreai_partitioner.backends.apple_coreai.deliver import DATA_TAG, EXTERNAL_DATA_KEY
from coreai_partitioner.backends.apple_coreai.preprocess import SHARE_ASSET_KEY
from coreai_partitioner.backends.apple_coreai.debug_info import DEFAULT as DEFAULT_DEBUG_INFO, compile_specs as debug_info_specs
from coreai_partitioner.partition.boundaries import split_by_segment
from coreai_partitioner.partition.kernel_gaps import fill_kernel_gaps
from coreai_partitioner.records.carried import claim_call_sites
from coreai_partitioner.records.call_sites import EXTERNALIZE_NAMESPACE, call_sites_by_op, module_path, op_module_path, pair_call_sites
from coreai_partitioner.records.externalize import check_records
from coreai_partitioner.partition import claims
from coreai_partitioner.partition.op_support import OperatorSupport, is_symbolic_scalar

#: Upstream (ExecuTorch 1.5.1) ``CoreAIPartitioner.partition``'s message for the legacy flow, with our records.
LEGACY_FLOW_ERROR = (
    "CoreAIPartitioner must be used with to_edge_transform_and_lower(). "
    "The to_edge() + to_backend() workflow is not supported because it "
    "decomposes ops that Core AI lowers directly. Please use:\n"
    "    exir.to_edge_transform_and_lower(\n"
    '        {"forward": exported_program},\n'
    "        partitioner=[CoreAIPartitioner(externalized_modules=records)],\n"
    "        compile_config=get_default_compile_config(),\n"
    "    )"
)


logger = logging.getLogger(__name__)


class CoreAIPartitioner(_compat.UpstreamCoreAIPartitioner):
    """Partition for Core AI, keeping externalized submodules as composite ops.

    Args:
        externalized_modules: the records :func:`externalize_modules` returned
            for the program being lowered.  Each ``coreai_torch_ext`` call site
            is found by its op target (node names change in ``to_edge``) and
            lowered as a ``noinline`` composite graph inside the delegate.
        debug_info: what the asset keeps of coreai-torch's debug locations:
            ``"none"`` (default, as ExecuTorch keeps debug data out of a
            ``.pte``), ``"op_ids"`` or ``"full"`` (torch stack traces with the
            build machine's source paths, for device diagnostics).
        share_asset: the methods lowered together with such partitioners (one
            ``to_backend`` call, one delegate each) share one Core AI asset,
            a function each named after its method, so weights they share are
            stored once (an LLM's prefill and decode methods).
        external_data: ``True`` puts the Core AI assets in a data file
            (``.ptd``) beside the ``.pte``, which keeps only graphs; ExecuTorch
            loads the pair with ``data_path=``.  :func:`~coreai_partitioner.save_pte`
            writes both (:mod:`coreai_partitioner.lowering.external_data`); a
            string is the data file's tag in the ``to_executorch()`` result.
            ``False`` (default): the assets are in the ``.pte``.
        **options: every option of ``executorch.backends.apple.coreai.CoreAIPartitioner``
            (``uses_sidecar``, ``aot_compile_config``, ``min_deployment_version``,
            ``input_enumerations``, ``take_over_constant_data``,
            ``take_over_mutable_buffer``).

    Use one partitioner per method when methods come from different
    :func:`externalize_modules` calls.
    """

    def __init__(
        self,
        externalized_modules: Sequence[Any] | None = None,
        *,
        debug_info: str = DEFAULT_DEBUG_INFO,
        share_asset: bool = False,
        external_data: bool | str = False,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        if external_data is True:
            external_data = DATA_TAG
        if external_data:
            check_external_data(external_data, options)
        self._records = check_records(externalized_modules)
        self._compile_specs = _compat.base_compile_specs(self) + debug_info_specs(debug_info)
        if share_asset:
            self._compile_specs.append(CompileSpec(SHARE_ASSET_KEY, b"1"))
        if external_data:
            self._compile_specs.append(CompileSpec(EXTERNAL_DATA_KEY, external_data.encode("utf-8")))
        self.delegation_spec = DelegationSpec(BACKEND_ID, self._compile_specs)
        # to_edge_transform_and_lower calls transform_for_pre_decomposition once
        # per method before partition(); the legacy to_edge() flow never does.
        self._pending_partitions = 0
        #: op -> every reason a node of it stayed outside the delegates although the converter knows the op
        #: (its arguments: ``avg_pool2d`` with ``ceil_mode``...), from every program partitioned so far
        self.refused: dict[str, list[str]] = {}

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        self._pending_partitions += 1
        return fill_kernel_gaps(_with_own_constants(exported_program))

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        if self._pending_partitions == 0:
            raise RuntimeError(LEGACY_FLOW_ERROR)
        self._pending_partitions -= 1

        graph = exported_program.graph
        pairing = pair_call_sites(self._records, [graph] + [r.exported_program.graph for r in self._records])
        for mismatch in pairing.mismatches:
            warnings.warn(str(mismatch), UserWarning, stacklevel=2)
        call_sites = call_sites_by_op(graph)
        paired = pairing.by_graph()
        claimable = {node.name for node, _ in paired.get(graph, ())}
        unpaired = {node.name: reason for node, reason in pairing.unpaired.items() if node.graph is graph}

        support = OperatorSupport(claimable, unpaired, _constant_placeholders(exported_program) if self.take_over_constant_data else frozenset())
        with claims.judging():  # each node and each rank-0 region judged once in this partitioning
            partitions = CapabilityBasedPartitioner(
                exported_program.graph_module, support, allows_single_node_partition=True
            ).propose_partitions()
        for op, reasons in support.refused.items():
            known = self.refused.setdefault(op, [])
            known.extend(reason for reason in reasons if reason not in known)
        delegation_spec = self._delegation_spec_for(exported_program)
        partition_tags: dict[str, DelegationSpec] = {}
        # A graph break the model marked (boundaries.segment) splits a partition in two.
        for number, nodes in enumerate(split_by_segment(graph, [set(p.nodes) for p in partitions])):
            tag = f"tag{number}"
            for node in nodes:
                node.meta["delegation_tag"] = tag
            partition_tags[tag] = delegation_spec
        raise_on_symbolic_outputs(graph)
        _raise_on_undelegated_call_sites(
            call_sites, support.rejected, {r.op_name: module_path(r) for r in self._records}
        )
        claimed = claim_call_sites(self._records, paired, graph)
        logger.info("CoreAIPartitioner: %d partition(s), %d externalized call site(s)", len(partition_tags), claimed)

        if self.take_over_constant_data:
            tag_constant_data(exported_program)
        if self.take_over_mutable_buffer:
            tag_mutated_buffer(exported_program)
        return PartitionResult(
            tagged_exported_program=exported_program, partition_tags=partition_tags
        )

    def _delegation_spec_for(self, exported_program: ExportedProgram) -> DelegationSpec:
        resolved = _compat.resolve_input_enumerations(exported_program, _compat.input_enumerations(self))
        if not resolved:
            return self.delegation_spec
        spec = CompileSpec(
            _compat.COMPILE_SPEC_KEYS.INPUT_ENUMERATIONS.value, json.dumps(resolved).encode()
        )
        return DelegationSpec(BACKEND_ID, self._compile_specs + [spec])


def check_external_data(tag: Any, options: dict[str, Any]) -> None:
    """Refuse a data-file tag ExecuTorch cannot name a file after, or one beside sidecar delivery."""
    if not isinstance(tag, str) or not tag or "/" in tag or tag.endswith(".ptd"):
        raise ValueError(
            f"external_data={tag!r}: give the data file's stem, e.g. external_data='model' for model.ptd "
            "(no directory, no .ptd suffix)"
        )
    if options.get("uses_sidecar"):
        raise ValueError(
            "external_data and uses_sidecar both move the asset out of the .pte; choose one "
            "(external_data: a .ptd ExecuTorch loads with data_path=; uses_sidecar: a directory beside it)"
        )


def _with_own_constants(program: ExportedProgram) -> ExportedProgram:
    """``program`` with a dict of constants of its own (the tensors shared).

    torch's ``run_decompositions`` hands its result the constants dict of the
    program it was given, and ExecuTorch pops the constants a delegate takes
    over from that dict: without this, lowering empties the caller's program
    of its lifted constants (``program.module()`` then fails with a KeyError).
    """
    return _compat.program_with_constants(program, dict(program.constants))


def _constant_placeholders(exported_program: ExportedProgram) -> frozenset[str]:
    """The placeholders of ``exported_program`` that hold constant data: parameters, lifted constants, buffers no
    method writes."""
    signature = exported_program.graph_signature
    written = set(signature.buffers_to_mutate.values())
    return frozenset(
        set(signature.inputs_to_parameters)
        | set(signature.inputs_to_lifted_tensor_constants)
        | {name for name, buffer in signature.inputs_to_buffers.items() if buffer not in written}
    )


def raise_on_symbolic_outputs(graph: torch.fx.Graph) -> None:
    """No delegate may return a symbolic scalar: the ``.aimodel`` would type it as a tensor.

    :class:`~coreai_partitioner.lowering.passes.SplitSymbolicSizes` gives each reader
    of a size its own ``sym_size`` and op support leaves one whose readers
    all stay outside out too, so what is left here is a symbolic scalar
    computed from a tensor only a delegate has: the error names it.
    """
    problems = []
    for node in graph.nodes:
        tag = node.meta.get("delegation_tag")
        if tag is None or not is_symbolic_scalar(node.meta.get("val")):
            continue
        readers = sorted(user.name for user in node.users if user.meta.get("delegation_tag") != tag)
        if readers:
            problems.append(
                f"  node {node.name} ({node.meta['val']}) is computed inside a Core AI delegate and read outside it by "
                f"{', '.join(readers)}"
            )
    if problems:
        raise RuntimeError(
            "a Core AI delegate cannot return a symbolic scalar:\n" + "\n".join(problems) + "\nLet the delegate take "
            "the readers, or leave the tensor the scalar is read from outside it (do_not_delegate)"
        )


def _raise_on_undelegated_call_sites(
    call_sites: dict[str, list[torch.fx.Node]],
    rejected: dict[str, str],
    paths_by_op: dict[str, str],
) -> None:
    """An externalized call site outside every delegate would be an un-runnable op."""
    problems = []
    for op_name, nodes in call_sites.items():
        for node in nodes:
            if "delegation_tag" in node.meta:
                continue
            submodule = paths_by_op.get(op_name) or op_module_path(op_name)
            problems.append(
                f"  submodule '{submodule}' (op {EXTERNALIZE_NAMESPACE}::{op_name}, "
                f"node {node.name}) is not delegated: "
                + rejected.get(node.name, "no Core AI partition took it")
            )
    if problems:
        raise RuntimeError(
            "externalized call site(s) would be left outside every Core AI delegate, "
            "where nothing can run them:\n" + "\n".join(problems)
        )
