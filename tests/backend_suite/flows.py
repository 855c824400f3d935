"""The Core AI flows: ExecuTorch's harness ``Tester`` with ``CoreAIPartitioner`` and this package's runtime.

A flow is the suite's unit (``executorch.backends.test.suite.flow.TestFlow``):
a name, a backend and a ``Tester`` factory.  The coreai flow lowers the way a
deployer does (``to_edge_transform_and_lower`` with ``CoreAIPartitioner``,
Core AI's compile config and transform passes) and runs the ``.pte`` in
ExecuTorch's own runtime, whose Core AI delegates run on this machine's
Core AI runtime (:func:`coreai_partitioner.load_runtime_backend`).
"""

from __future__ import annotations

import functools
from typing import Any

import executorch.backends.test.harness.stages as stages
from executorch.backends.test.harness import Tester
from executorch.backends.test.harness.stages import StageType
from executorch.backends.test.suite.flow import TestFlow
from executorch.exir import to_edge_transform_and_lower

import torch

from coreai_partitioner import CoreAIPartitioner, get_default_passes, load_runtime_backend
from coreai_partitioner._compat import unverified_compile_config
from coreai_partitioner.lowering.device import check_delegates, relabel_backend


class Lower(stages.ToEdgeTransformAndLower):
    """``to_edge_transform_and_lower`` as a deployer calls it for Core AI (the IR check off, as every flow's)."""

    def __init__(self, partitioners: list | None = None, edge_compile_config: Any = None) -> None:
        super().__init__(partitioners=partitioners, edge_compile_config=edge_compile_config or unverified_compile_config())

    def run(self, artifact: Any, inputs: Any = None, generate_etrecord: bool = False) -> None:
        self.edge_dialect_program = to_edge_transform_and_lower(
            artifact,
            compile_config=self.edge_compile_conf,
            partitioner=self.partitioners or [CoreAIPartitioner()],
            transform_passes=get_default_passes(),
            generate_etrecord=generate_etrecord,
        )


class DeviceLower(Lower):
    """:class:`Lower`, then the delegates carry upstream's device id and are held to its runtime's contract."""

    def run(self, artifact: Any, inputs: Any = None, generate_etrecord: bool = False) -> None:
        super().run(artifact, inputs, generate_etrecord)
        relabel_backend(self.edge_dialect_program)
        check_delegates(self.edge_dialect_program)


class CoreAITester(Tester):
    """The harness ``Tester`` whose lowering is Core AI's and whose runtime has the Core AI backend."""

    lower_stage = Lower

    def __init__(self, module: Any, example_inputs: Any, dynamic_shapes: Any = None) -> None:
        load_runtime_backend()
        classes = Tester.default_stage_classes() | {
            StageType.TO_EDGE_TRANSFORM_AND_LOWER: self.lower_stage,
            StageType.PARTITION: functools.partial(stages.Partition, partitioner=CoreAIPartitioner()),
        }
        super().__init__(module, example_inputs, stage_classes=classes, dynamic_shapes=dynamic_shapes)


class CoreAIDeviceTester(CoreAITester):
    """:class:`CoreAITester` for the device form: the ``.pte`` upstream's on-device Core AI runtime loads."""

    lower_stage = DeviceLower


#: upstream's device runtime takes fp16/fp32 tensors only (``coreai_backend.mm``'s ``scalar_type``)
_DEVICE_DTYPES = "upstream's on-device Core AI runtime takes fp16/fp32 tensors only"

COREAI_TEST_FLOW = TestFlow("coreai", backend="coreai", tester_factory=CoreAITester)
COREAI_DEVICE_TEST_FLOW = TestFlow(
    "coreai_device",
    backend="coreai",
    tester_factory=CoreAIDeviceTester,
    param_skip_reasons={
        "dtype": {dtype: _DEVICE_DTYPES for dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)}
    },
)

FLOWS = [COREAI_TEST_FLOW, COREAI_DEVICE_TEST_FLOW]
