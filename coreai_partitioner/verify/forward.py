"""One call of a ``.pte``'s method (an encoder's ``forward``) against the eager model it was lowered from.

What ``export --verify`` runs for the encoder tasks (``fill-mask``,
``feature-extraction``, ``image-classification``), in two halves, so that
the fp32 model can be gone before the model to export is loaded:

1. :func:`reference` calls the fp32 model on seeded inputs and keeps its
   outputs, with the shape the runtime's tolerance is taken from: its
   longest reduction and the number of its weights that reduce, as
   :func:`~.fidelity.runtime_threshold_of` counts them for any model.
   :func:`outputs` calls the model at the program's dtype on the same inputs.
2. :func:`check` calls the method in ExecuTorch's runtime
   (:func:`~.execution.run`) on those inputs and judges each output against
   the eager model's at the program's dtype by SNR, within the runtime's
   own rounding at that dtype (:mod:`.fidelity`), and, where the outputs are
   logits, each position's top-1 but at a near-tie.  How far it is from the
   fp32 model is reported beside it, and decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner.verify import fidelity
from coreai_partitioner.verify.execution import as_tuple, run


@dataclass(frozen=True)
class Reference:
    """The fp32 model called once: its inputs, its outputs (float32), and the shape its tolerance is taken from."""

    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    width: int  # the longest reduction of its weights' ops
    depth: int  # how many of its weights an op reduces over (as if in series: the most noise it can gather)

    def threshold(self, dtype: torch.dtype | str) -> fidelity.Threshold:
        """The runtime's tolerance for a program of this model at ``dtype`` (:func:`fidelity.runtime_threshold`)."""
        return fidelity.runtime_threshold(dtype, width=self.width, depth=self.depth)


def at_dtype(inputs: Sequence[torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """``inputs`` as a model or program at ``dtype`` takes them: floating ones cast, ids as they are."""
    return tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)


def outputs(forward: Callable[..., Any], inputs: Sequence[torch.Tensor], dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """``forward(*inputs)`` of an eager model at ``dtype`` (its floating inputs cast to it), each output in float32."""
    with torch.no_grad():
        return tuple(output.float() for output in as_tuple(forward(*at_dtype(inputs, dtype))))


def reference(model: torch.nn.Module, forward: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> Reference:
    """:class:`Reference` of ``forward`` (``model`` at fp32, called as the program's method is) on ``inputs``."""
    lengths = [length for length in fidelity.reduction_lengths(model).values() if length > 0]
    return Reference(tuple(inputs), outputs(forward, inputs), max(lengths), len(lengths))


@dataclass(frozen=True)
class ForwardReport:
    """A method's outputs against the eager model it was lowered from (:attr:`against`), the fp32 model's beside them."""

    method: str
    inputs: tuple[tuple[int, ...], ...]  # the shapes it was called on
    signal: fidelity.SignalReport  # against the eager model: decides
    distance: tuple[str, ...]  # each output against the fp32 model's: a report
    against: str

    @property
    def ok(self) -> bool:
        return self.signal.ok

    def __str__(self) -> str:
        shapes = ", ".join(str(list(shape)) for shape in self.inputs)
        lines = [f"verify: {self.method}({shapes}) on seeded inputs against {self.against}, the check:", str(self.signal)]
        lines += [f"output {i} against the fp32 model (a report): {said}" for i, said in enumerate(self.distance)]
        return "\n".join(lines)

    def raise_for_mismatch(self) -> None:
        if not self.ok:
            raise AssertionError(f"the .pte's {self.method} is not close enough to {self.against}:\n" + str(self))


def distance(actual: torch.Tensor, fp32: torch.Tensor, logits: bool) -> str:
    """How far ``actual`` is from the fp32 model's ``fp32``, in words: :func:`fidelity.quality` of logits, else SNR."""
    if logits:
        return str(fidelity.quality(actual, fp32))
    snr, psnr = fidelity.snr_psnr(actual, fp32)
    return f"SNR {snr:.1f} dB, PSNR {psnr:.1f} dB"


def check(
    program: Any,
    reference: Reference,
    *,
    eager: Sequence[torch.Tensor] | None = None,
    dtype: torch.dtype = torch.float32,
    logits: bool = False,
    method: str = "forward",
    threshold: fidelity.Threshold | None = None,
) -> ForwardReport:
    """Call ``method`` of ``program`` (a ``.pte`` path, or what :func:`~.execution.run` takes) on ``reference``'s inputs
    (floating ones at ``dtype``, what the program was lowered at) and judge it (see the module).

    ``eager`` is :func:`outputs` of the model at ``dtype``; an fp32 program of the fp32 model may leave it out.
    With ``logits`` each output's last dimension is a score per class or token.  The tolerance is the runtime's at
    ``dtype`` (:meth:`Reference.threshold`) unless ``threshold`` is given.
    """
    expected = fidelity.against(eager, reference.outputs, dtype, how="outputs() of the model at its dtype")
    actual = run(program, *at_dtype(reference.inputs, dtype), method=method)
    arithmetic = fidelity.arithmetic(dtype, width=reference.width, depth=reference.depth)
    signal = fidelity.compare(actual, expected, threshold or reference.threshold(dtype), logits=logits, precision=arithmetic)
    distances = tuple(distance(a, e, logits) for a, e in zip(actual, reference.outputs))
    shapes = tuple(tuple(x.shape) for x in reference.inputs)
    return ForwardReport(method, shapes, signal, distances, f"the eager model ({fidelity.precision_name(dtype)})")
