"""RoPE's cos and sin tables at a call's positions, from the model's own frequencies."""

from __future__ import annotations

import torch
from torch import nn


class RopeTable(nn.Module):
    """RoPE's cos and sin at a call's positions, as HF's rotary embedding computes them.

    ``inv_freq`` is the model's own (every HF rope type's init function has
    run: default, linear, llama3, yarn, longrope, ...), ``scaling`` its
    ``attention_scaling``.  A longrope table also holds the long factors'
    frequencies and picks them for a call whose last position is at or past
    ``switch`` (HF's ``original_max_position_embeddings``), per call as HF does;
    padding positions (at or past ``context``) do not count.
    Returns half-width tables ``[1, 1, T, dim / 2]``, what the ``rope``
    composite takes.
    """

    def __init__(
        self,
        inv_freq: torch.Tensor,
        scaling: float = 1.0,
        *,
        long_inv_freq: torch.Tensor | None = None,
        switch: int = 0,
        context: int = 0,
    ) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.detach().float().clone(), persistent=False)
        if long_inv_freq is not None:
            self.register_buffer("long_inv_freq", long_inv_freq.detach().float().clone(), persistent=False)
        self.long = long_inv_freq is not None
        self.switch = switch
        self.context = context
        self.scaling = float(scaling)

    @property
    def dim(self) -> int:
        return 2 * self.inv_freq.shape[0]

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        position = positions.float().unsqueeze(-1)
        inv_freq = self.inv_freq
        if self.long:  # padding (positions at or past the context) does not count
            real = positions.float()
            longest = torch.where(real < float(self.context), real, torch.zeros_like(real)).max() + 1.0
            inv_freq = torch.where(longest > float(self.switch), self.long_inv_freq, self.inv_freq)
        angle = position * inv_freq
        cos, sin = angle.cos(), angle.sin()
        if self.scaling != 1.0:
            cos, sin = cos * self.scaling, sin * self.scaling
        return cos.to(dtype)[None, None], sin.to(dtype)[None, None]
