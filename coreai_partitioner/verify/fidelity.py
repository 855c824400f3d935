"""How close a low-precision program comes to its fp32 model: SNR and PSNR of the outputs, top-1 with near-ties.

An fp16 or quantized program cannot match its fp32 model element by element:
coreai-core's Linux runtime accumulates fp16 matmuls in fp16, and quantized
weights are other weights.  The field judges low precision by signal to
noise instead, and so does this module: :func:`snr_psnr` is coremltools'
``compute_snr_and_psnr`` (the SNR is ExecuTorch Inspector's
``calculate_numeric_gap("SNR")``), in float64.  Outputs that are logits
are centered first (each position less its mean over the vocabulary:
softmax does not see a shift, and an LLM's logits sit around a large
common offset that would count as signal), and are also judged by their
top-1 at every position, which may differ from the reference's only where
the reference's top two are closer than a margin (a near-tie).

:data:`DTYPE_THRESHOLDS` and :data:`SCHEME_THRESHOLDS` hold the least SNR
and PSNR and that margin for each dtype and each quantization scheme, keyed
by name; :func:`threshold_for` adds a scheme's row to its dtype's (their
noises add).  A new scheme is one line there: measure its SNR on a real
model (README, "Low-precision verify") and leave room below it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner.verify.table import OutputsReport

__all__ = [
    "DTYPE_THRESHOLDS",
    "SCHEME_THRESHOLDS",
    "SignalComparison",
    "SignalReport",
    "Threshold",
    "UnknownPrecision",
    "centered",
    "compare",
    "precision_name",
    "snr_psnr",
    "threshold_for",
    "tie_margins",
]


@dataclass(frozen=True)
class Threshold:
    """What a program's outputs must reach against the fp32 model's.

    ``snr`` and ``psnr`` are the least SNR and PSNR in dB; ``tie`` is the
    margin between the reference's top two logits below which the program's
    top-1 may be another token, in standard deviations of the reference's
    logits at that position (so it means the same at any logit scale).
    """

    snr: float
    psnr: float
    tie: float

    def __add__(self, other: Threshold) -> Threshold:
        """Both errors at once: their noise powers add, and so do the tie margins' squares."""

        def db(a: float, b: float) -> float:
            return -10 * math.log10(10 ** (-a / 10) + 10 ** (-b / 10))

        return Threshold(db(self.snr, other.snr), db(self.psnr, other.psnr), math.hypot(self.tie, other.tie))


#: Per dtype the program computes in: the least SNR and PSNR (dB) of its centered logits against the fp32 model's,
#: and the tie margin.  SmolLM2-135M-Instruct's 30 layers, as ``export-llm --verify`` measures them (a random
#: 8-token prompt, 8 greedy tokens): fp32 106.3 / 122.1 dB, fp16 32.2 / 48.0 dB, top-1 different once, at a
#: margin of 0.017 (README, "Low-precision verify").
DTYPE_THRESHOLDS = {
    "fp32": Threshold(snr=60.0, psnr=70.0, tie=0.001),
    "fp16": Threshold(snr=25.0, psnr=40.0, tie=0.1),
}

#: Per quantization scheme (``quantize.SCHEMES``), added to its dtype's row: one line each.  Measured the same way,
#: fp32 base: int8 24.1 / 39.9 dB, top-1 never different; int4 6.4 / 22.2 dB, top-1 different 6 times in 8, each
#: at a margin below 0.87.  Two middle layers swapped are within int4's noise (README, "Low-precision verify").
#: The others on the same prompt (8 positions; fp32's top two at most 0.866 apart at each): int4-channel
#: 4.6 / 20.3 dB, top-1 different 6 times; palettize8 22.1 / 37.9 dB, once (at 0.063); palettize4-mixed
#: 7.2 / 22.9 dB, 3 times; palettize4 3.4 / 19.2 dB, 5 times.  Rows are those less about 2 dB SNR and 3 dB PSNR.
SCHEME_THRESHOLDS = {
    "int8": Threshold(snr=18.0, psnr=33.0, tie=0.3),
    "int4": Threshold(snr=3.0, psnr=17.0, tie=1.0),
    "int4-channel": Threshold(snr=2.5, psnr=17.0, tie=1.0),
    "palettize8": Threshold(snr=20.0, psnr=35.0, tie=0.3),
    "palettize4": Threshold(snr=1.5, psnr=16.0, tie=1.0),
    "palettize4-mixed": Threshold(snr=5.0, psnr=20.0, tie=1.0),
}

#: The dtype rows' names, as the LLM exporter's ``--dtype`` spells them.
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class UnknownPrecision(ValueError):
    """A dtype or quantization scheme without a threshold; the message names the known ones and the fix."""


def _row(table: dict[str, Threshold], name: str, what: str) -> Threshold:
    row = table.get(name)
    if row is None:
        where = "DTYPE_THRESHOLDS" if table is DTYPE_THRESHOLDS else "SCHEME_THRESHOLDS"
        raise UnknownPrecision(
            f"no SNR threshold for {what} {name!r}: coreai_partitioner.verify.fidelity.{where} has "
            f"{', '.join(table)}. Add a row for it (its SNR and PSNR against the fp32 model, measured on a real "
            "model, less a margin), or pass threshold=Threshold(snr=..., psnr=..., tie=...)"
        )
    return row


def threshold_for(dtype: torch.dtype | str = torch.float32, quantize: str | None = None) -> Threshold:
    """The :class:`Threshold` of a program lowered at ``dtype`` with weights quantized by ``quantize``.

    ``dtype`` is a torch dtype or a row name (``"fp16"``); ``quantize`` a
    scheme name (``lower``'s ``quantize=``) or ``None``.  Raises
    :class:`UnknownPrecision` for a dtype or scheme without a row.
    """
    name = dtype if isinstance(dtype, str) else DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))
    threshold = _row(DTYPE_THRESHOLDS, name, "dtype")
    if quantize is None:
        return threshold
    return threshold + _row(SCHEME_THRESHOLDS, quantize, "quantization scheme")


def precision_name(dtype: torch.dtype | str = torch.float32, quantize: str | None = None) -> str:
    """``"fp16"``, ``"fp32 + int4"``: the rows :func:`threshold_for` adds."""
    name = dtype if isinstance(dtype, str) else DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))
    return name + (f" + {quantize}" if quantize else "")


def centered(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` less each position's mean over the last dimension, in float64."""
    values = logits.detach().cpu().to(torch.float64)
    return values - values.mean(-1, keepdim=True)


def snr_psnr(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """SNR and PSNR (dB) of ``actual`` against ``expected``, as coremltools' ``compute_snr_and_psnr``."""
    a = actual.detach().cpu().to(torch.float64).flatten()
    e = expected.detach().cpu().to(torch.float64).flatten()
    noise = float(((a - e) ** 2).mean()) if e.numel() else 0.0
    signal = float((e**2).mean()) if e.numel() else 0.0
    peak = float((e**2).max()) if e.numel() else 0.0
    return 10 * math.log10((signal + 1e-5) / (noise + 1e-10)), 10 * math.log10((peak + 1e-5) / (noise + 1e-10))


@dataclass(frozen=True)
class TopOne:
    """Each position's top-1 of a logits output against the reference's: where they differ, and whether at a tie."""

    positions: int
    flips: int  # the top-1 differs where the reference's top two are at least the tie margin apart
    ties: int  # the top-1 differs, the reference's top two closer than the margin: allowed

    def __str__(self) -> str:
        same = self.positions - self.flips - self.ties
        return f"{same}/{self.positions}" + (f" ({self.ties} at a tie)" if self.ties else "")


def tie_margins(expected: torch.Tensor) -> torch.Tensor:
    """Per position of logits ``[..., vocab]``: the gap between the top two, in standard deviations of that
    position's logits (the unit of :attr:`Threshold.tie`)."""
    e = expected.detach().cpu().to(torch.float64).reshape(-1, expected.shape[-1])
    top2 = e.topk(min(2, e.shape[-1]), dim=-1).values
    spread = e.std(-1, unbiased=False).clamp_min(1e-30)
    return (top2[:, 0] - top2[:, -1]) / spread


def top_one(actual: torch.Tensor, expected: torch.Tensor, tie: float) -> TopOne:
    """:class:`TopOne` of two logits tensors ``[..., vocab]``."""
    a = actual.detach().cpu().reshape(-1, actual.shape[-1])
    e = expected.detach().cpu().reshape(-1, expected.shape[-1])
    differs = a.argmax(-1) != e.argmax(-1)
    ties = int((differs & (tie_margins(e) < tie)).sum())
    return TopOne(len(e), int(differs.sum()) - ties, ties)


@dataclass(frozen=True)
class SignalComparison:
    """One output against the reference: SNR, PSNR, largest error, top-1 (logits), and what it needed."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    snr: float
    psnr: float
    max_abs_error: float
    threshold: Threshold
    top1: TopOne | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return (
            not self.note
            and self.snr >= self.threshold.snr
            and self.psnr >= self.threshold.psnr
            and (self.top1 is None or self.top1.flips == 0)
        )

    def failures(self) -> list[str]:
        """What failed, in words."""
        said = [self.note] if self.note else []
        if self.snr < self.threshold.snr:
            said.append(f"SNR {self.snr:.1f} < {self.threshold.snr:.1f} dB")
        if self.psnr < self.threshold.psnr:
            said.append(f"PSNR {self.psnr:.1f} < {self.threshold.psnr:.1f} dB")
        if self.top1 is not None and self.top1.flips:
            said.append(f"top-1 differs at {self.top1.flips} position(s) with a margin of {self.threshold.tie:g} or more")
        return said


@dataclass(frozen=True)
class SignalReport(OutputsReport):
    """Per output: a low-precision program against its fp32 reference, judged by :class:`Threshold`."""

    precision: str = ""

    headers = ("output", "shape", "dtype", "SNR dB", "PSNR dB", "max abs err", "top-1 same", "needs SNR / PSNR", "result")
    falls_short = "lowered program is not close enough to its fp32 reference"

    def row(self, o: SignalComparison) -> list[Any]:
        return [
            o.index,
            tuple(o.shape),
            str(o.dtype).replace("torch.", ""),
            f"{o.snr:.1f}",
            f"{o.psnr:.1f}",
            f"{o.max_abs_error:.3e}",
            str(o.top1) if o.top1 is not None else "",
            f"{o.threshold.snr:.1f} / {o.threshold.psnr:.1f}",
            "ok" if o.ok else "; ".join(o.failures()),
        ]

    def notes(self) -> list[str]:
        said = [f"thresholds of {self.precision} (coreai_partitioner.verify.fidelity)"] if self.precision else []
        return said + super().notes()


def compare(
    actual: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    threshold: Threshold,
    *,
    logits: bool = False,
    precision: str = "",
) -> SignalReport:
    """Judge ``actual`` against ``expected`` (the fp32 model's outputs) by ``threshold``.

    With ``logits`` every output's last dimension is a score per token: SNR
    and PSNR are of the centered logits (:func:`centered`), and each
    position's top-1 must be the reference's unless the reference's top two
    are closer than ``threshold.tie``.
    """
    rows = []
    for index, (a, e) in enumerate(zip(actual, expected)):
        if tuple(a.shape) != tuple(e.shape):
            note = f"shape {tuple(a.shape)} != {tuple(e.shape)}"
            rows.append(SignalComparison(index, tuple(e.shape), a.dtype, -math.inf, -math.inf, math.inf, threshold, note=note))
            continue
        if not (a.is_floating_point() and e.is_floating_point()):
            same = torch.equal(a.cpu(), e.cpu())
            rows.append(SignalComparison(index, tuple(e.shape), a.dtype, math.inf if same else -math.inf, math.inf if same else -math.inf,
                                         0.0 if same else math.inf, threshold, note="" if same else "integer output differs"))
            continue
        snr, psnr = snr_psnr(centered(a), centered(e)) if logits else snr_psnr(a, e)
        nan = bool(torch.isnan(a).any()) and not bool(torch.isnan(e).any())
        max_abs = float((a.double() - e.double()).abs().max()) if e.numel() else 0.0
        top1 = top_one(a, e, threshold.tie) if logits and e.dim() > 0 else None
        rows.append(SignalComparison(index, tuple(e.shape), a.dtype, snr, psnr, max_abs, threshold, top1, "NaN in the output" if nan else ""))
    note = ""
    if len(actual) != len(expected):
        note = f"the program returns {len(actual)} output(s), the reference {len(expected)}"
    return SignalReport(tuple(rows), note, precision)
