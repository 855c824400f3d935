"""A quantized program against its quantized eager model (pass or fail) and its float model (what it cost).

    ep = quantize(ep, "int4", records=records)
    reference = ep.module()                          # before lowering takes ep's constants
    lowered = lower_exported((ep, records))
    check_quantized(lowered, reference, model, *sample).raise_for_mismatch()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner.verify.execution import as_tuple, run
from coreai_partitioner.verify.report import compare

@dataclass(frozen=True)
class QuantizedReport:
    """A quantized program against the quantized eager model (pass/fail) and the float one (what it cost)."""

    against_quantized: Any  # verify.Report
    against_float: Any  # verify.Report

    @property
    def ok(self) -> bool:
        return self.against_quantized.ok

    def __str__(self) -> str:
        costs = "\n".join(
            f"  output {o.index}: max abs error {o.max_abs_error:.3e}, max rel error {o.max_rel_error:.3e}"
            for o in self.against_float.outputs
        )
        return (
            f"against the quantized eager model:\n{self.against_quantized}\n\n"
            f"cost of quantization (against the float model; information, not a check):\n{costs}"
        )

    def raise_for_mismatch(self) -> None:
        """Raise with both tables when the program does not match the quantized eager model."""
        if not self.ok:
            raise AssertionError("quantized program does not match the quantized eager model:\n" + str(self))


def check_quantized(
    program: Any,
    quantized_reference: Callable[..., Any] | Sequence[torch.Tensor] | torch.Tensor,
    float_reference: Callable[..., Any] | Sequence[torch.Tensor] | torch.Tensor,
    *inputs: Any,
    rtol: float | None = None,
    atol: float | None = None,
    method: str = "forward",
) -> QuantizedReport:
    """Run ``program`` once (see :func:`~.execution.run`) and compare it with both references.

    ``quantized_reference`` is the quantized eager model (``quantize(...).module()``)
    or its outputs; the program must match it within tolerance.
    ``float_reference`` is the float model or its outputs; that error is
    reported, not judged.
    """
    actual = run(program, *inputs, method=method)
    expected = [_outputs(reference, inputs) for reference in (quantized_reference, float_reference)]
    return QuantizedReport(
        compare(actual, expected[0], rtol, atol),
        compare(actual, expected[1], rtol, atol),
    )


def _outputs(reference: Any, inputs: tuple) -> tuple[torch.Tensor, ...]:
    if callable(reference):
        with torch.no_grad():
            reference = reference(*inputs)
    return as_tuple(reference)
