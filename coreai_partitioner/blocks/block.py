"""One decoder layer: a mixer and an MLP between their norms, each added to the residual."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """One decoder layer: ``h = x + post_attn(mixer(pre_attn(x)))``, then ``h + post_mlp(mlp(pre_mlp(h)))``.

    Llama's ``input_layernorm`` is ``pre_attn`` and its ``post_attention_layernorm``
    ``pre_mlp``; Gemma has all four; OLMo 2 only the ``post_`` ones.  ``mixer``
    is attention or a recurrent mixer (anything taking ``(x, step)``).  A
    family whose residual differs overrides :meth:`residual` (Granite scales it).
    """

    def __init__(
        self,
        mixer: nn.Module,
        mlp: nn.Module,
        *,
        pre_attn: nn.Module | None = None,
        post_attn: nn.Module | None = None,
        pre_mlp: nn.Module | None = None,
        post_mlp: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.mixer, self.mlp = mixer, mlp
        self.pre_attn, self.post_attn, self.pre_mlp, self.post_mlp = pre_attn, post_attn, pre_mlp, post_mlp

    @staticmethod
    def _through(module: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
        return module(x) if module is not None else x

    def residual(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The residual stream after a branch's output ``out`` joins it."""
        return x + out

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        h = self.residual(x, self._through(self.post_attn, self.mixer(self._through(self.pre_attn, x), step)))
        return self.residual(h, self._through(self.post_mlp, self.mlp(self._through(self.pre_mlp, h))))
