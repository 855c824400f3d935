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

from coreai_partitioner import CoreAIPartitioner, get_default_passes, load_runtime_backend
from coreai_partitioner._compat import unverified_compile_config


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


class CoreAITester(Tester):
    """The harness ``Tester`` whose lowering is Core AI's and whose runtime has the Core AI backend."""

    def __init__(self, module: Any, example_inputs: Any, dynamic_shapes: Any = None) -> None:
        load_runtime_backend()
        classes = Tester.default_stage_classes() | {
            StageType.TO_EDGE_TRANSFORM_AND_LOWER: Lower,
            StageType.PARTITION: functools.partial(stages.Partition, partitioner=CoreAIPartitioner()),
        }
        super().__init__(module, example_inputs, stage_classes=classes, dynamic_shapes=dynamic_shapes)


COREAI_TEST_FLOW = TestFlow("coreai", backend="coreai", tester_factory=CoreAITester)

FLOWS = [COREAI_TEST_FLOW]
