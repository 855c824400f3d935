"""RMSNorm through the ``rms_norm`` composite, over an HF norm module's own weight."""

from __future__ import annotations

import torch
from coreai_torch.composite_ops import RMSNormImpl
from torch import nn


class Norm(nn.Module):
    """An RMSNorm through the ``rms_norm`` composite: ``x / rms(x) * scale``.

    ``scale`` is the HF module's weight; ``plus_one`` norms (Gemma, Qwen3-Next)
    scale by ``1 + weight`` computed in fp32, and ``fp32_scale`` norms (OLMo 2)
    multiply in fp32 before the cast back: both are the composite's own
    branch for an fp32 scale.  ``weight=None`` is a norm without a scale.
    """

    def __init__(self, weight: nn.Parameter | None, eps: float, *, plus_one: bool = False, fp32_scale: bool = False) -> None:
        super().__init__()
        self.weight = weight
        if weight is None:
            self.register_buffer("ones", torch.ones(()), persistent=False)
        self.plus_one = plus_one
        self.fp32_scale = fp32_scale
        self.impl = RMSNormImpl(eps=float(eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return self.impl(x, self.ones.to(x.dtype).expand(x.shape[-1]))
        scale = self.weight
        if self.plus_one:
            scale = scale.float() + 1.0
        elif self.fp32_scale:
            scale = scale.float()
        return self.impl(x, scale)


def norm_eps(module: nn.Module) -> float:
    """The epsilon of an HF norm module, whichever name it has."""
    for name in ("variance_epsilon", "eps", "epsilon"):
        value = getattr(module, name, None)
        if isinstance(value, float):
            return value
    raise ValueError(f"{type(module).__name__} has no epsilon attribute (variance_epsilon, eps)")


def norm(module: nn.Module | None, **options: bool) -> Norm | None:
    """:class:`Norm` over an HF RMSNorm module's own weight (``None`` stays ``None``)."""
    if module is None:
        return None
    return Norm(getattr(module, "weight", None), norm_eps(module), **options)
