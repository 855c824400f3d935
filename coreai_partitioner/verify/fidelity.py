"""How close a program comes to its eager model, by the runtime's own arithmetic; how far from fp32, as a report.

A program cannot match its eager model element by element: the Core AI
runtime rounds and sums in its own order, and coreai-core's Linux runtime
accumulates fp16 matmuls in fp16 where PyTorch accumulates in fp32.  The
field judges such outputs by signal to noise, and so does this module:
:func:`snr_psnr` is coremltools' ``compute_snr_and_psnr`` (the SNR is
ExecuTorch Inspector's ``calculate_numeric_gap("SNR")``), in float64.
Outputs that are logits are centered first (each position less its mean
over the vocabulary: softmax does not see a shift, and an LLM's logits sit
around a large common offset that would count as signal), and are also
judged by their top-1 at every position, which may differ from the
reference's only where the reference's top two are closer than a margin
(a near-tie).

The reference is the eager model the program was lowered from, at the
program's dtype, its weights as the program stores them (the quantized
eager model for a quantization scheme): a right conversion differs from it
by rounding alone.  :func:`runtime_threshold` says how much rounding, from
the runtime's arithmetic and the model's shape, never from a model's
measured SNR.  ``benchmarks/fp16_accumulation.py`` measures every matmul of
the Core AI runtime within ``u * sqrt(K)`` of the exact result, ``u`` the
unit roundoff of the dtype it accumulates in and ``K`` the reduced length
(``benchmarks/results/fp16_accumulation.txt``: 0.5 to 1.0 times it in fp16,
0.6 to 0.8 times in fp32, for K from 64 to 3072).  A program's output
gathers that noise once per stage of its depth (a decoder's layers, each
adding its matmuls' rounding to the residual stream, and its lm_head), at
most at its widest ``K``, and independent noises add in power: about
``u * sqrt(K) * sqrt(depth)`` of its spread.  The network's own gain can
make more of it (``benchmarks/results/verify_families.txt``: every family's
tiny model against the bound, at fp32 and fp16), so the least SNR is the
bound's less :data:`GAIN_DB`.

:func:`quality` says how far the program is from the fp32 model (what fp16
or a quantization scheme costs): a report, never a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner.verify.table import OutputsReport

__all__ = [
    "GAIN_DB",
    "TIE_NOISES",
    "UNIT_ROUNDOFF",
    "Quality",
    "SignalComparison",
    "SignalReport",
    "Threshold",
    "UnknownPrecision",
    "against",
    "arithmetic",
    "centered",
    "compare",
    "precision_name",
    "quality",
    "reduction_length",
    "reduction_lengths",
    "runtime_threshold",
    "runtime_threshold_of",
    "snr_psnr",
    "tie_margins",
]


@dataclass(frozen=True)
class Threshold:
    """What a program's outputs must reach against their reference.

    ``snr`` is the least SNR in dB, ``psnr`` the least PSNR (none by
    default: the runtime's tolerance is a noise power, which the SNR
    judges); ``tie`` is the margin between the reference's top two logits
    below which the program's top-1 may be another token, in standard
    deviations of the reference's logits at that position (so it means the
    same at any logit scale).
    """

    snr: float
    psnr: float = -math.inf
    tie: float = 0.0


#: The unit roundoff of the arithmetic a program at each dtype runs in on the Core AI runtime (half the gap
#: between 1 and the next number): coreai-core accumulates an fp16 program's matmuls in fp16.
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11}

#: What the network's gain may add to the rounding bound ``u * sqrt(K) * sqrt(depth)``, in dB of SNR.
GAIN_DB = 10.0

#: The tie margin in units of the rounding bound: two logits that each move by that noise move apart by
#: sqrt(2) times it, and 6 is about four standard deviations of that.
TIE_NOISES = 6.0

#: The dtype names, as the LLM exporter's ``--dtype`` spells them.
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class UnknownPrecision(ValueError):
    """A dtype without runtime numerics; the message names the known ones and the fix."""


def _name(dtype: torch.dtype | str) -> str:
    return dtype if isinstance(dtype, str) else DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def runtime_threshold(dtype: torch.dtype | str, *, width: int, depth: int) -> Threshold:
    """The :class:`Threshold` of a program at ``dtype`` against its eager model, from the runtime's arithmetic.

    ``width`` is the longest reduction of its matmuls (its widest Linear's
    inputs), ``depth`` the number of stages whose rounding adds up (a
    decoder's layers plus its lm_head).  The rounding bound is
    ``u * sqrt(width) * sqrt(depth)`` of the output's spread (module
    docstring); the least SNR is that in dB less :data:`GAIN_DB`, and the tie
    margin :data:`TIE_NOISES` times the bound.  Raises
    :class:`UnknownPrecision` for a dtype without a unit roundoff here.
    """
    name = _name(dtype)
    if name not in UNIT_ROUNDOFF:
        raise UnknownPrecision(
            f"no runtime numerics for dtype {name!r}: coreai_partitioner.verify.fidelity.UNIT_ROUNDOFF has "
            f"{', '.join(UNIT_ROUNDOFF)}. Lower at one of them, or pass threshold=Threshold(snr=..., tie=...)"
        )
    if width < 1 or depth < 1:
        raise ValueError(f"runtime_threshold needs a width and a depth of at least 1, not {width} and {depth}")
    bound = UNIT_ROUNDOFF[name] * math.sqrt(width) * math.sqrt(depth)
    return Threshold(snr=-20 * math.log10(bound) - GAIN_DB, tie=TIE_NOISES * bound)


def width_of(model: torch.nn.Module) -> int:
    """The longest last dimension of ``model``'s weight matrices: the longest reduction of its matmuls."""
    return max(p.shape[-1] for p in model.parameters() if p.dim() >= 2 and p.is_floating_point())


def runtime_threshold_of(model: torch.nn.Module, dtype: torch.dtype | str) -> Threshold:
    """:func:`runtime_threshold` of any ``model``: its width the longest reduction of a weight's op
    (:func:`reduction_lengths`), its depth the number of weights that reduce (as if all were in series: the most
    noise it can gather)."""
    lengths = [length for length in reduction_lengths(model).values() if length > 0]
    if not lengths:
        raise ValueError(
            f"{type(model).__name__} has no weights an op reduces over (a Linear's, a convolution's) to take a width "
            "and a depth from; pass threshold="
        )
    return runtime_threshold(dtype, width=max(lengths), depth=len(lengths))


def reduction_lengths(model: torch.nn.Module) -> dict[str, int]:
    """``{parameter name: products summed per output element}`` for every floating weight of rank 2 and up in
    ``model`` (:func:`reduction_length` of the module holding it); a weight two modules read (a tied lm_head's
    embedding) takes the longer of their reductions, under its first name."""
    lengths: dict[int, tuple[str, int]] = {}
    for path, module in model.named_modules():
        for name, weight in module.named_parameters(recurse=False):
            if weight.dim() < 2 or not weight.is_floating_point() or not weight.numel():
                continue
            length = reduction_length(module, name)
            first, known = lengths.get(id(weight), (f"{path}.{name}" if path else name, 0))
            lengths[id(weight)] = (first, max(known, length))
    return dict(lengths.values())


_CONVOLUTIONS = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
_TRANSPOSED = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)


def reduction_length(module: torch.nn.Module, parameter: str = "weight") -> int:
    """How many products the op reading ``module``'s ``parameter`` sums into each output element: the ``K`` of
    the rounding bound ``u * sqrt(K)``.

    - a Linear ``[out, in]``: ``in``;
    - a convolution ``[out, in / groups, *kernel]``: ``in / groups`` times the kernel's area or volume;
    - a transposed convolution ``[in, out / groups, *kernel]``: ``in / groups`` times, along each spatial dim,
      the kernel taps that land on one output, ``ceil(k / (stride / gcd(stride, dilation)))`` (with a stride
      of 1, the whole kernel);
    - an embedding: 0, a gather sums nothing;
    - any other weight: its largest dimension, as the op reducing it is not known here; a longer ``K`` than the
      true one only loosens the tolerance (by 10 log10 of the ratio, in dB), a shorter one would fail a right
      program.
    """
    weight = getattr(module, parameter)
    if isinstance(module, torch.nn.Embedding) and parameter == "weight":
        return 0
    if isinstance(module, torch.nn.Linear) and parameter == "weight":
        return weight.shape[1]
    if isinstance(module, _CONVOLUTIONS) and parameter == "weight":
        return weight.shape[1] * math.prod(weight.shape[2:])
    if isinstance(module, _TRANSPOSED) and parameter == "weight":
        kernel = weight.shape[2:]
        taps = [
            math.ceil(k / (s // math.gcd(s, d))) for k, s, d in zip(kernel, module.stride, module.dilation)
        ]
        return weight.shape[0] // module.groups * math.prod(taps)
    return max(weight.shape)


def precision_name(dtype: torch.dtype | str = torch.float32, quantize: str | None = None) -> str:
    """``"fp16"``, ``"fp32 + int4"``: what a program was lowered with."""
    return _name(dtype) + (f" + {quantize}" if quantize else "")


def arithmetic(dtype: torch.dtype | str, *, width: int, depth: int) -> str:
    """What :func:`runtime_threshold` takes its tolerance from, in words (a report's precision line)."""
    return f"the runtime's {_name(dtype)} arithmetic at width {width}, depth {depth}"


def against(eager: Any, fp32: Any, dtype: torch.dtype | str, quantize: str | None = None, *, how: str) -> Any:
    """What a program lowered at ``dtype`` with ``quantize`` is judged against: ``eager``, the outputs of the eager
    model it was lowered from.  An fp32 program of the fp32 model may leave it out (``None``): ``fp32``, the fp32
    model's outputs, are its eager model's.  Any other program without it is refused, ``how`` saying how to make it."""
    if eager is not None:
        return eager
    if quantize is None and _name(dtype) == "fp32":
        return fp32
    raise ValueError(
        f"a {precision_name(dtype, quantize)} program is checked against the eager model it was lowered from: "
        f"pass eager= ({how})"
    )


def centered(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` less each position's mean over the last dimension, in float64."""
    values = logits.detach().cpu().to(torch.float64)
    return values - values.mean(-1, keepdim=True)


def snr_psnr(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """SNR and PSNR (dB) of ``actual`` against ``expected``, in float64: ExecuTorch Inspector's SNR, and
    coremltools' ``compute_snr_and_psnr`` without its floor (it adds 1e-10 to the noise power, which caps the
    SNR of small outputs near 84 dB, below what an fp32 program reaches).  No noise is an infinite SNR."""
    a = actual.detach().cpu().to(torch.float64).flatten()
    e = expected.detach().cpu().to(torch.float64).flatten()
    if not e.numel():
        return math.inf, math.inf
    noise = float(((a - e) ** 2).mean())
    signal, peak = float((e**2).mean()), float((e**2).max())

    def db(power: float) -> float:
        if noise == 0:
            return math.inf if power > 0 else 0.0
        return 10 * math.log10(power / noise) if power > 0 else -math.inf

    return db(signal), db(peak)


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
            said.append(f"top-1 differs at {self.top1.flips} position(s) with a margin of {self.threshold.tie:.3g} or more")
        return said


@dataclass(frozen=True)
class SignalReport(OutputsReport):
    """Per output: a program against its reference, judged by :class:`Threshold`."""

    precision: str = ""

    headers = ("output", "shape", "dtype", "SNR dB", "PSNR dB", "max abs err", "top-1 same", "needs SNR", "result")
    falls_short = "lowered program is not close enough to its reference"

    def row(self, o: SignalComparison) -> list[Any]:
        needs = f"{o.threshold.snr:.1f}" + (f", PSNR {o.threshold.psnr:.1f}" if o.threshold.psnr > -math.inf else "")
        return [
            o.index,
            tuple(o.shape),
            str(o.dtype).replace("torch.", ""),
            f"{o.snr:.1f}",
            f"{o.psnr:.1f}",
            f"{o.max_abs_error:.3e}",
            str(o.top1) if o.top1 is not None else "",
            needs,
            "ok" if o.ok else "; ".join(o.failures()),
        ]

    def notes(self) -> list[str]:
        said = [f"tolerance of {self.precision} (coreai_partitioner.verify.fidelity)"] if self.precision else []
        return said + super().notes()


def compare(
    actual: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    threshold: Threshold,
    *,
    logits: bool = False,
    precision: str = "",
) -> SignalReport:
    """Judge ``actual`` against ``expected`` (the eager model's outputs) by ``threshold``.

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


@dataclass(frozen=True)
class Quality:
    """How far a program's logits are from the fp32 model's: what fp16 or a scheme costs.  A report, not a check."""

    snr: float
    psnr: float
    same: int  # positions whose top-1 is the fp32 model's
    positions: int

    def __str__(self) -> str:
        return f"SNR {self.snr:.1f} dB, PSNR {self.psnr:.1f} dB, top-1 the same at {self.same} of {self.positions} position(s)"


def quality(actual: torch.Tensor, fp32: torch.Tensor) -> Quality:
    """:class:`Quality` of logits ``actual`` ``[..., vocab]`` against the fp32 model's ``fp32``."""
    snr, psnr = snr_psnr(centered(actual), centered(fp32))
    a, e = actual.detach().cpu().reshape(-1, actual.shape[-1]), fp32.detach().cpu().reshape(-1, fp32.shape[-1])
    return Quality(snr, psnr, int((a.argmax(-1) == e.argmax(-1)).sum()), len(e))
