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
    """A mixer with state carried from call to call: every token of a call must be a real one.

    Its state buffers end in ``_state``; with a verify method each has a stash
    (:func:`add_stashes`), ``stash_of_<name>``: its value after each position
    of the last verify call, so the next call goes on after any number of
    accepted drafts (:meth:`~.step.Step.carry`).
    """

    def stash(self, name: str) -> torch.Tensor | None:
        """The stash of state ``name``, or ``None`` when the decoder has no verify method."""
        return getattr(self, f"stash_of_{name}", None)


def add_stashes(decoder: nn.Module, rows: int) -> None:
    """Give every recurrent layer of ``decoder`` a stash of ``rows`` states per state buffer, and the decoder
    ``stash_positions_state`` (which positions, plus one, the rows hold; 0: none).

    Rollback of recurrent state by per-position states: a verify call of ``rows``
    tokens costs its recurrent layers ``rows`` times their state in memory,
    and no call more (a re-run of the accepted tokens would cost one).
    """
    for module in decoder.modules():
        if isinstance(module, Recurrent):
            for name, state in list(module.named_buffers(recurse=False)):
                if name.endswith("_state"):
                    stash = torch.zeros(rows, *state.shape, dtype=state.dtype)
                    module.register_buffer(f"stash_of_{name}", stash, persistent=False)
    decoder.register_buffer("stash_positions_state", torch.zeros(rows), persistent=False)


def causal_conv(
    conv: nn.Conv1d, state: torch.Tensor, x: torch.Tensor, step, stash: torch.Tensor | None = None
) -> torch.Tensor:
    """A depthwise causal convolution of ``x`` [B, C, T] continuing from ``state`` [B, C, K - 1], which it advances.

    The convolution runs over ``state`` (zeros at position 0: :meth:`~.step.Step.carry`)
    and ``x`` together with no padding, so it gives exactly ``T`` outputs,
    each from its last ``K`` inputs; the state keeps the last ``K - 1``
    inputs for the next call (what HF's cache keeps, less the column it
    never reads).  In a verify call ``stash`` takes the state after each
    position: the ``K - 1`` inputs up to it.
    """
    window = torch.cat([step.carry(state, stash), x.to(state.dtype)], dim=-1)
    kept = state.shape[-1]
    if step.verifying and stash is not None:
        states = torch.stack([window[..., t + 1 : t + 1 + kept] for t in range(x.shape[-1])])
    else:
        states = window[..., -kept:].unsqueeze(0)  # a start from the end: static whatever T is
    step.keep(state, stash, states)
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
        mixed = nn.functional.silu(causal_conv(m.conv1d, self.conv_state, mixed, step, self.stash("conv_state")))
        mixed = mixed.transpose(1, 2)
        q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv], dim=-1)
        q, k, v = q.view(batch, length, hk, dk), k.view(batch, length, hk, dk), v.view(batch, length, hv, dv)
        beta = torch.sigmoid(b)
        g = -m.A_log.float().exp() * nn.functional.softplus(a.float() + m.dt_bias)
        if hv > hk:  # value head j reads key head j // (hv / hk), by index: repeat_interleave trips torch.export
            heads = torch.arange(hk, device=x.device).repeat_interleave(hv // hk)
            q, k = q.index_select(2, heads), k.index_select(2, heads)
        stash = self.stash("recurrent_state")
        q, k, v, g, beta = (t.transpose(1, 2) for t in (q, k, v, g, beta))
        state = step.carry(self.recurrent_state, stash).to(q.dtype)
        if step.verifying and stash is not None:  # the state after every position: one update per token
            outs, states = [], []
            for t in range(length):
                out, state = self.update(*(u[:, :, t : t + 1] for u in (q, k, v, g, beta)), state)
                outs.append(out)
                states.append(state)
            out, states = torch.cat(outs, dim=1), torch.stack(states)
        else:
            out, state = self.update(q, k, v, g, beta, state)
            states = state.unsqueeze(0)
        step.keep(self.recurrent_state, stash, states.to(self.recurrent_state.dtype))
        normed = self.norm(out) * nn.functional.silu(z.float())  # out: [B, T, Hv, dv]
        return m.out_proj(normed.to(x.dtype).reshape(batch, length, hv * dv))
