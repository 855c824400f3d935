"""Recurrent mixers: a causal convolution continuing from its state, and the gated delta rule.

A :class:`Recurrent` mixer carries state from call to call (the delegate's
state in the host form, the program's buffers in the device form), so a
call padded with tokens that are not real ones would change it: such
decoders take only dynamic shapes.
"""

from __future__ import annotations

import torch
from coreai_torch.composite_ops import GatedDeltaUpdate
from torch import nn

from coreai_partitioner.blocks.norm import Norm, norm_eps


class Recurrent(nn.Module):
    """A mixer with state carried from call to call: every token of a call must be a real one."""


def causal_conv(conv: nn.Conv1d, state: torch.Tensor, x: torch.Tensor, step) -> torch.Tensor:
    """A depthwise causal convolution of ``x`` [B, C, T] continuing from ``state`` [B, C, K - 1], which it advances.

    The convolution runs over ``state`` (zeros at position 0: :meth:`~.step.Step.carry`)
    and ``x`` together with no padding, so it gives exactly ``T`` outputs,
    each from its last ``K`` inputs; the state keeps the last ``K - 1``
    inputs for the next call (what HF's cache keeps, less the column it
    never reads).
    """
    window = torch.cat([step.carry(state), x.to(state.dtype)], dim=-1)
    state.copy_(window[..., -state.shape[-1] :])  # a start from the end: static whatever T is
    return nn.functional.conv1d(window.to(x.dtype), conv.weight, conv.bias, groups=conv.groups)


class GatedDeltaNet(Recurrent):
    """Qwen3.5's linear attention, its recurrence through the ``gated_delta_update`` composite.

    Projections ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``
    (:meth:`project`; Qwen3-Next groups them by key head, and its family file
    overrides it), a causal depthwise conv with SiLU over q, k and v
    (:func:`causal_conv`), ``beta = sigmoid(b)``, ``g = -exp(A_log) *
    softplus(a + dt_bias)``, key heads repeated to the value heads, the gated
    delta rule over the call's tokens from the state the last call left (the
    composite's ``initial_state``, zeros at position 0; it normalizes q and k
    and scales q), then a per-head RMSNorm gated by ``silu(z)`` and
    ``out_proj``.  ``conv_state`` and ``recurrent_state`` are buffers: the
    delegate's state.
    """

    def __init__(self, module: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module  # the HF linear-attention module: its projections, conv, A_log, dt_bias, norm
        self.heads = (module.num_k_heads, module.num_v_heads)
        self.dims = (module.head_k_dim, module.head_v_dim)
        self.norm = Norm(module.norm.weight, norm_eps(module.norm))
        self.update = GatedDeltaUpdate(use_qk_l2_norm=True)
        channels = module.conv1d.weight.shape[0]
        kernel = module.conv1d.weight.shape[-1]
        self.register_buffer("conv_state", torch.zeros(1, channels, kernel - 1, dtype=dtype), persistent=False)
        state = (1, module.num_v_heads, module.head_k_dim, module.head_v_dim)
        self.register_buffer("recurrent_state", torch.zeros(state, dtype=dtype), persistent=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(mixed [B, C, T] in q|k|v channel order, z [B, T, Hv, dv], b, a [B, T, Hv])``."""
        m, (_, hv), (_, dv) = self.module, self.heads, self.dims
        batch, length = x.shape[0], x.shape[1]
        mixed = m.in_proj_qkv(x)
        z = m.in_proj_z(x).view(batch, length, hv, dv)
        return mixed.transpose(1, 2), z, m.in_proj_b(x), m.in_proj_a(x)

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        m, (hk, hv), (dk, dv) = self.module, self.heads, self.dims
        batch, length = x.shape[0], x.shape[1]
        mixed, z, b, a = self.project(x)
        mixed = nn.functional.silu(causal_conv(m.conv1d, self.conv_state, mixed, step)).transpose(1, 2)
        q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv], dim=-1)
        q, k, v = q.view(batch, length, hk, dk), k.view(batch, length, hk, dk), v.view(batch, length, hv, dv)
        beta = torch.sigmoid(b)
        g = -m.A_log.float().exp() * nn.functional.softplus(a.float() + m.dt_bias)
        if hv > hk:  # value head j reads key head j // (hv / hk), by index: repeat_interleave trips torch.export
            heads = torch.arange(hk, device=x.device).repeat_interleave(hv // hk)
            q, k = q.index_select(2, heads), k.index_select(2, heads)
        out, state = self.update(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), g.transpose(1, 2), beta.transpose(1, 2),
            step.carry(self.recurrent_state).to(q.dtype),
        )
        self.recurrent_state.copy_(state)
        normed = self.norm(out) * nn.functional.silu(z.float())  # out: [B, T, Hv, dv]
        return m.out_proj(normed.to(x.dtype).reshape(batch, length, hv * dv))
