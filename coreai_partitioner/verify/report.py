"""Compare a program's outputs with eager PyTorch: element by element, or by SNR for low precision.

:func:`check` runs a program (:func:`~.execution.run`) and compares it with its
reference; :func:`compare` compares outputs already in hand.  A low-precision
program is judged against the fp32 model by :mod:`.fidelity` instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner.verify import fidelity
from coreai_partitioner.verify.execution import as_tuple, run
from coreai_partitioner.verify.table import OutputsReport


def default_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing an output of ``dtype`` with eager PyTorch."""
    if dtype in (torch.float16,):
        return 1e-2, 1e-2
    if dtype in (torch.bfloat16,):
        return 2e-2, 2e-2
    if dtype.is_floating_point:
        return 1e-4, 1e-5
    return 0.0, 0.0


@dataclass(frozen=True)
class OutputComparison:
    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    max_abs_error: float
    max_rel_error: float
    rtol: float
    atol: float
    mismatched: int
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.note and self.mismatched == 0


@dataclass(frozen=True)
class Report(OutputsReport):
    """Per-output comparison of a lowered program with its reference, element by element."""

    headers = ("output", "shape", "dtype", "max abs err", "max rel err", "rtol", "atol", "result")

    def row(self, o: OutputComparison) -> list[Any]:
        return [
            o.index,
            tuple(o.shape),
            str(o.dtype).replace("torch.", ""),
            f"{o.max_abs_error:.3e}",
            f"{o.max_rel_error:.3e}",
            f"{o.rtol:.0e}",
            f"{o.atol:.0e}",
            "ok" if o.ok else (o.note or f"MISMATCH ({o.mismatched} element(s) out of tolerance)"),
        ]


def compare(
    actual: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    rtol: float | None = None,
    atol: float | None = None,
) -> Report:
    """Compare outputs element-wise: ``|actual - expected| <= atol + rtol * |expected|``."""
    rows = []
    for index, (a, e) in enumerate(zip(actual, expected)):
        e = e.detach().cpu()
        a = a.detach().cpu()
        default_rtol, default_atol = default_tolerances(e.dtype)
        r = default_rtol if rtol is None else rtol
        t = default_atol if atol is None else atol
        if a.shape != e.shape:
            rows.append(OutputComparison(index, tuple(e.shape), e.dtype, float("inf"), float("inf"), r, t, a.numel(), f"shape {tuple(a.shape)} != {tuple(e.shape)}"))
            continue
        a64, e64 = a.to(torch.float64), e.to(torch.float64)
        diff = (a64 - e64).abs()
        max_abs = float(diff.max()) if diff.numel() else 0.0
        scale = float(e64.abs().max()) if e64.numel() else 0.0
        max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
        mismatched = int((diff > t + r * e64.abs()).sum()) + int(torch.isnan(a64).ne(torch.isnan(e64)).sum())
        note = "" if a.dtype == e.dtype else f"dtype {a.dtype} != {e.dtype}"
        rows.append(OutputComparison(index, tuple(e.shape), e.dtype, max_abs, max_rel, r, t, mismatched, note))
    note = ""
    if len(actual) != len(expected):
        note = f"the program returns {len(actual)} output(s), the reference {len(expected)}"
    return Report(tuple(rows), note)


def check(
    program: Any,
    reference: Callable[..., Any] | Sequence[torch.Tensor] | torch.Tensor,
    *inputs: Any,
    rtol: float | None = None,
    atol: float | None = None,
    dtype: torch.dtype | str | None = None,
    threshold: Any = None,
    logits: bool = False,
    method: str = "forward",
    sidecar_dir: str | os.PathLike | None = None,
) -> Report | Any:
    """Run ``program`` (see :func:`run`) and compare it with ``reference(*inputs)``.

    ``reference`` is the eager module, any callable, or the expected outputs.
    By default each output is compared element by element, with tolerances
    that follow its dtype (fp32 tighter than fp16/bf16).

    With ``dtype`` (what the program was lowered with) each output is judged
    by SNR against the tolerance of the runtime's arithmetic at that dtype
    instead (:func:`coreai_partitioner.verify.fidelity.runtime_threshold_of`
    the ``reference`` module, or pass a ``fidelity.Threshold`` as
    ``threshold``); the result is a ``fidelity.SignalReport``.  The
    reference is then the model at that dtype (the quantized eager model
    for a quantized program: :func:`~.quantized.check_quantized`).  With
    ``logits`` the outputs are logits (centered before SNR, and each
    position's top-1 must agree unless the reference has a near-tie there).
    A dtype without runtime numerics is refused before the program runs.
    """
    judged = dtype is not None or threshold is not None
    if logits and not judged:
        raise ValueError("logits=True judges by SNR: also pass dtype= the program was lowered with, or threshold=")
    if judged and threshold is None:
        if not isinstance(reference, torch.nn.Module):
            raise ValueError("dtype= takes the tolerance from the reference module's shape: pass the module, or threshold=")
        threshold = fidelity.runtime_threshold_of(reference, dtype)
    actual = run(program, *inputs, method=method, sidecar_dir=sidecar_dir)
    if callable(reference):
        with torch.no_grad():
            expected = as_tuple(reference(*inputs))
    else:
        expected = as_tuple(reference)
    if judged:
        name = fidelity.precision_name(dtype) if dtype is not None else ""
        return fidelity.compare(actual, expected, threshold, logits=logits, precision=name)
    return compare(actual, expected, rtol, atol)
