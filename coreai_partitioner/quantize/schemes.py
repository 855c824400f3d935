"""What each ``quantize=`` scheme stores, and whether every weight's shape fits it, checked before any work.

A :class:`Scheme` says how Linear weights (and MoE experts) and how
embeddings (an embedding tied to the lm_head is one tensor) are stored, each
as a :class:`~.weight_forms.Form`:

========================  ====================================  ==================================
scheme                    Linear weights, experts               embeddings, a tied lm_head
========================  ====================================  ==================================
``int8``                  int8 per output channel               int8 per output channel
``int4``                  int4 in blocks of 32 input channels   int8 per output channel
``int4-channel``          int4 per output channel               int8 per output channel
``palettize4``            4-bit tables per 32 output channels   int8 per output channel
``palettize8``            8-bit tables per 32 output channels   int8 per output channel
``palettize4-mixed``      ``palettize4``; the weights 4 bits    int8 per output channel
                          fit worst, up to 1/8 of them, at 8
========================  ====================================  ==================================

The ``int`` schemes store coreai-opt's integers and scales, the tables
k-means' (:mod:`.palettize`), each weight on its own (:mod:`.store`).  A group of a
look-up table is ``size`` consecutive output channels (rows of a Linear's
``[out, in]`` weight, of an embedding's ``[vocab, width]``) sharing one
table of ``2 ** bits`` values, 32 by default as Apple's coreai-models preset
``4bit_weight_palettized_group32``; each weight stores only its index.  The
table is found over the rows each divided by its largest magnitude, and each
output channel stores that scale (coreai-opt's and coremltools'
per-channel scale): one table then serves rows of different scales.
Embeddings stay 8-bit per channel under every scheme, as Apple's iOS presets
leave embeddings out of palettization and ExecuTorch's Core ML LLM export
quantizes them to 8 bits (``-E 8,0``): a tied embedding is the lm_head,
and on SmolLM2-135M a table-stored one alone costs more perplexity than every
Linear weight's table (``benchmarks/results/quality.txt``).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from coreai_partitioner.quantize.weight_forms import Form

__all__ = [
    "SCHEMES", "Planned", "QuantizationError", "Scheme", "check_fits", "misfits", "scheme", "warn_per_block_int_on_device",
]


class QuantizationError(ValueError):
    """A layer a scheme cannot store, or a configuration it cannot apply; the message names it and the way out."""


@dataclass(frozen=True)
class Scheme:
    """A ``quantize=`` scheme: the form of Linear weights and of embeddings; for a mixed scheme, the form the
    Linear weights 4 bits fit worst are promoted to, up to ``promoted_share`` of those weights."""

    name: str
    linear: Form
    embedding: Form
    promoted: Form | None = None
    promoted_share: float = 0.0

    @property
    def palettized(self) -> bool:
        """Look-up tables (:mod:`.palettize`), not integers."""
        return self.linear.kind == "lut"

    def __str__(self) -> str:
        text = f"{self.name}: Linear weights {self.linear}"
        if self.promoted is not None:
            text += f" (the {self.promoted_share:.0%} 4 bits fit worst: {self.promoted})"
        return text + f"; embeddings {self.embedding}"

    def sized(self, *, group_size: int | None = None, block_size: int | None = None) -> Scheme:
        """The same scheme with other look-up table groups (``group_size``) or int blocks (``block_size``)."""

        def resize(form: Form | None) -> Form | None:
            if form is None:
                return None
            if form.kind == "lut" and group_size is not None:
                return dataclasses.replace(form, size=group_size)
            if form.kind == "int" and form.size is not None and block_size is not None:
                return dataclasses.replace(form, size=block_size)
            return form

        return dataclasses.replace(
            self, linear=resize(self.linear), embedding=resize(self.embedding), promoted=resize(self.promoted)
        )


_CHANNEL8 = Form("int", 8)
SCHEMES = {
    s.name: s
    for s in (
        Scheme("int8", Form("int", 8), _CHANNEL8),
        Scheme("int4", Form("int", 4, 32), _CHANNEL8),
        Scheme("int4-channel", Form("int", 4), _CHANNEL8),
        Scheme("palettize4", Form("lut", 4, 32, scaled=True), _CHANNEL8),
        Scheme("palettize8", Form("lut", 8, 32, scaled=True), _CHANNEL8),
        Scheme(
            "palettize4-mixed", Form("lut", 4, 32, scaled=True), _CHANNEL8, promoted=Form("lut", 8, 32, scaled=True),
            promoted_share=1 / 8,
        ),
    )
}


def scheme(name: str | Scheme, *, group_size: int | None = None, block_size: int | None = None) -> Scheme:
    """The :class:`Scheme` called ``name`` (one of :data:`SCHEMES`), its groups or blocks resized if asked."""
    if isinstance(name, Scheme):
        found = name
    elif name in SCHEMES:
        found = SCHEMES[name]
    else:
        raise ValueError(
            f"no quantization scheme named {name!r}; choose one of {', '.join(SCHEMES)}, "
            "or pass a coreai_opt.quantization.QuantizerConfig"
        )
    return found.sized(group_size=group_size, block_size=block_size) if group_size or block_size else found


#: Apple's report that per-block integer weights come out wrong on the Neural Engine.
NEURAL_ENGINE_REPORT = "apple/coreai-models#279"
#: The schemes of :data:`SCHEMES` whose Linear weights are no per-block integers, which the warning names.
NEURAL_ENGINE_SCHEMES = ("int4-channel", "palettize4", "palettize4-mixed")


def per_block_int(quantize: object) -> bool:
    """Whether a ``quantize=`` scheme (a name of :data:`SCHEMES` or a :class:`Scheme`) stores integers in blocks of
    input channels; a coreai-opt ``QuantizerConfig`` is its own and answers False."""
    if isinstance(quantize, str):
        quantize = SCHEMES.get(quantize)
    if not isinstance(quantize, Scheme):
        return False
    return any(f is not None and f.kind == "int" and f.size is not None for f in (quantize.linear, quantize.promoted))


def warn_per_block_int_on_device(quantize: object) -> None:
    """Warn, once per call, that a per-block integer scheme in the on-device form may be wrong on the Neural Engine.

    Apple's coreai-models #279 measured a vision encoder on an iPhone 16 Pro
    Max (iOS 27.0) against fp32: 8-bit per-block int weights gave cosine 0.367
    on the Neural Engine and 0.999 on the GPU, 8-bit palettized ones 0.9975 on
    the Neural Engine.  Nothing here runs a Neural Engine, so the warning
    repeats the report and names the schemes without per-block integers.
    """
    if not per_block_int(quantize):
        return
    name = quantize.name if isinstance(quantize, Scheme) else quantize
    warnings.warn(
        f"quantize={name!r} stores Linear weights as integers in blocks of input channels, and Apple's "
        f"{NEURAL_ENGINE_REPORT} reports per-block int weights silently wrong on the Neural Engine (8-bit per-block "
        "int: cosine 0.367 against fp32 on an iPhone 16 Pro Max, iOS 27.0; 0.999 on the GPU; 8-bit palettized: 0.9975 "
        f"on the Neural Engine).  Where the device form may run on the Neural Engine, quantize with one of "
        f"{', '.join(NEURAL_ENGINE_SCHEMES)} (no per-block integers), or check the output on the device; "
        "this package does not run a Neural Engine (docs/quantization.md)",
        stacklevel=3,
    )


@dataclass(frozen=True)
class Planned:
    """One weight a scheme stores: its parameter ``name``, ``layer`` (the module holding it), ``shape``, output
    ``axis``, the ``form`` the scheme gives it, and the axis of its ``inputs`` (``axis + 1`` unless given:
    :meth:`~.weight_forms.Form.misfit`)."""

    name: str
    layer: str
    shape: tuple[int, ...]
    form: Form
    axis: int = 0
    inputs: int | None = None

    @property
    def misfit(self) -> str | None:
        """Why its form cannot store it, or ``None``."""
        return self.form.misfit(self.shape, self.axis, self.inputs)


def misfits(planned: Sequence[Planned]) -> list[tuple[Planned, str]]:
    """Every weight of ``planned`` its form cannot store, with the reason."""
    return [(p, p.misfit) for p in planned if p.misfit is not None]


def check_fits(planned: Sequence[Planned], scheme_name: str) -> None:
    """Raise :class:`QuantizationError` naming every weight whose shape its form does not fit, and the ways out."""
    unstorable = misfits(planned)
    if not unstorable:
        return
    listed = "; ".join(f"{p.name} {list(p.shape)} as {p.form}: {reason}" for p, reason in unstorable)
    layers = sorted({p.layer or p.name for p, _ in unstorable})
    fixes = [
        f"keep {'it' if len(layers) == 1 else 'them'} float (keep_float=[{', '.join(map(repr, layers))}])"
    ]
    smaller = _smaller_size(unstorable)
    if smaller is not None:
        keyword = "group_size" if unstorable[0][0].form.kind == "lut" else "block_size"
        fixes.append(f"or use {keyword}={smaller}, which divides them (quantize=schemes.scheme({scheme_name!r}, {keyword}={smaller}))")
    raise QuantizationError(f"{scheme_name} cannot store {len(unstorable)} weight(s): {listed}. Either {', '.join(fixes)}.")


def _smaller_size(unstorable: list[tuple[Planned, str]]) -> int | None:
    """The largest group or block size dividing every misfit's channels, when there is one above 1."""
    kinds = {p.form.kind for p, _ in unstorable}
    if len(kinds) != 1 or any(len(p.shape) < p.axis + 2 for p, _ in unstorable):
        return None
    size = 0
    for p, _ in unstorable:
        inputs = p.axis + 1 if p.inputs is None else p.inputs
        size = math.gcd(size, p.form.size or 0, p.shape[p.axis] if p.form.kind == "lut" else p.shape[inputs])
    return size if size > 1 else None
