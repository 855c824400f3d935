"""The Core AI flows: ExecuTorch's harness ``Tester`` lowering with :func:`coreai_partitioner.lower`, and this package's runtime.

A flow is the suite's unit (``executorch.backends.test.suite.flow.TestFlow``):
a name, a backend and a ``Tester`` factory.  The coreai flow lowers the way a
user does: its export stage is :func:`~coreai_partitioner.export_with_composites`
and its lowering stage :func:`~coreai_partitioner.lower_exported`, the two halves
of :func:`~coreai_partitioner.lower` (``get_default_compile_config()``,
``get_default_passes()``), and it runs the ``.pte`` in ExecuTorch's own
runtime, whose Core AI delegates run on this machine's Core AI runtime
(:func:`coreai_partitioner.load_runtime_backend`).  The coreai_int8 flow is
``lower(model, sample, quantize="int8")``: weight-only int8, per output
channel, its reference the exported program with those weights (as
XNNPACK's quantized flows compare with their quantized export), beside
XNNPACK's ``xnnpack_static_int8_per_channel``.
"""

from __future__ import annotations

import functools
from typing import Any

import executorch.backends.test.harness.stages as stages
from executorch.backends.test.harness import Tester
from executorch.backends.test.harness.stages import StageType
from executorch.backends.test.suite.flow import TestFlow

import torch

from coreai_partitioner import CoreAIPartitioner, export_with_composites, load_runtime_backend, lower_exported
from coreai_partitioner.lowering.device import check_delegates, relabel_backend


class Export(stages.Export):
    """``export_with_composites``, keeping the records for :class:`Lower` (the artifact is the program, eager's
    reference)."""

    def __init__(self, records: dict, dynamic_shapes: Any = None, quantize: str | None = None) -> None:
        super().__init__(dynamic_shapes=dynamic_shapes)
        self.records = records
        self.quantize = quantize

    def run(self, artifact: torch.nn.Module, inputs: Any) -> None:
        self.exported_program, self.records["records"] = export_with_composites(
            artifact, inputs, dynamic_shapes=self.dynamic_shapes, quantize=self.quantize
        )


class Lower(stages.ToEdgeTransformAndLower):
    """``lower_exported`` on what :class:`Export` made: what ``lower(model, sample)`` calls."""

    def __init__(self, records: dict, partitioners: list | None = None, edge_compile_config: Any = None) -> None:
        super().__init__(partitioners=partitioners, edge_compile_config=edge_compile_config)
        self.records = records

    def run(self, artifact: Any, inputs: Any = None, generate_etrecord: bool = False) -> None:
        self.edge_dialect_program = lower_exported((artifact, self.records.get("records")), generate_etrecord=generate_etrecord)


class DeviceLower(Lower):
    """:class:`Lower`, then the delegates carry upstream's device id and are held to its runtime's contract."""

    def run(self, artifact: Any, inputs: Any = None, generate_etrecord: bool = False) -> None:
        super().run(artifact, inputs, generate_etrecord)
        relabel_backend(self.edge_dialect_program)
        check_delegates(self.edge_dialect_program)


class CoreAITester(Tester):
    """The harness ``Tester`` whose export and lowering are ``lower()``'s and whose runtime has the Core AI backend."""

    lower_stage = Lower
    quantize: str | None = None

    def __init__(self, module: Any, example_inputs: Any, dynamic_shapes: Any = None) -> None:
        load_runtime_backend()
        records: dict = {}  # what the export stage hands the lowering stage beside the program
        classes = Tester.default_stage_classes() | {
            StageType.EXPORT: functools.partial(Export, records, quantize=self.quantize),
            StageType.TO_EDGE_TRANSFORM_AND_LOWER: functools.partial(self.lower_stage, records),
            StageType.PARTITION: functools.partial(stages.Partition, partitioner=CoreAIPartitioner()),
        }
        super().__init__(module, example_inputs, stage_classes=classes, dynamic_shapes=dynamic_shapes)


class CoreAIInt8Tester(CoreAITester):
    """:class:`CoreAITester` lowering with ``quantize="int8"``: each Linear, convolution and embedding weight int8."""

    quantize = "int8"


class CoreAIDeviceTester(CoreAITester):
    """:class:`CoreAITester` for the device form: the ``.pte`` upstream's on-device Core AI runtime loads."""

    lower_stage = DeviceLower


#: upstream's device runtime takes fp16/fp32 tensors only (``coreai_backend.mm``'s ``scalar_type``)
_DEVICE_DTYPES = "upstream's on-device Core AI runtime takes fp16/fp32 tensors only"

COREAI_TEST_FLOW = TestFlow("coreai", backend="coreai", tester_factory=CoreAITester)
COREAI_INT8_TEST_FLOW = TestFlow("coreai_int8", backend="coreai", tester_factory=CoreAIInt8Tester)
COREAI_DEVICE_TEST_FLOW = TestFlow(
    "coreai_device",
    backend="coreai",
    tester_factory=CoreAIDeviceTester,
    param_skip_reasons={
        "dtype": {dtype: _DEVICE_DTYPES for dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)}
    },
)

FLOWS = [COREAI_TEST_FLOW, COREAI_INT8_TEST_FLOW, COREAI_DEVICE_TEST_FLOW]
