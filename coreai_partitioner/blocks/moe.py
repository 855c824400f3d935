"""Routed experts through the ``gather_mm`` composite, over HF's 3-D expert parameters."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from coreai_torch.composite_ops import GatherMM
from torch import nn

from coreai_partitioner.blocks.mlp import activation


class MoE(nn.Module):
    """Routed experts through the ``gather_mm`` composite: every token's top-k experts, no loop, no data-dependent shape.

    ``router`` is the HF router's weight ``[E, H]``: a softmax over the
    experts, then the top ``top_k``, their weights renormalized to sum to 1
    when ``renormalize`` (HF's ``norm_topk_prob``).  The experts are HF's 3-D
    parameters, stored once: ``gate_up`` ``[E, 2I, H]`` (gate rows first, then
    up) and ``down`` ``[E, H, I]``.  Each token's k experts are two
    ``gather_mm`` calls (gate-up, then down) over the expert tensors as
    stored; their outputs, weighted, are summed.

    A family whose experts differ subclasses this in its own file: its
    routing (:meth:`route`), its gated unit (:meth:`glu`), how a token meets
    its experts (:meth:`expert_outputs`; ``out_axis = 2`` for experts stored
    ``[E, in, out]``, GPT-OSS), or a shared expert beside them (Qwen3-Next).
    """

    #: The axis of an expert tensor that holds its output channels: 1 for HF's ``[E, out, in]``.
    out_axis = 1

    def __init__(
        self,
        *,
        router: nn.Parameter,
        gate_up: nn.Parameter,
        down: nn.Parameter,
        top_k: int,
        renormalize: bool,
        act: str = "silu",
    ) -> None:
        super().__init__()
        self.router = router
        self.gate_up, self.down = gate_up, down
        self.top_k, self.renormalize = top_k, renormalize
        self.act = activation(act)
        self.gather_up = GatherMM(num_batch_axes=0)
        self.gather_down = GatherMM(num_batch_axes=0)
        #: ``{expert tensor name: its Form}`` once :meth:`quantize_experts` stored them compressed.
        self.forms: dict[str, Any] = {}

    def _out_first(self, weight: torch.Tensor) -> torch.Tensor:
        """``weight`` as ``[E, out, in]`` (a view)."""
        return weight.transpose(1, 2) if self.out_axis == 2 else weight

    def planned(self, scheme: Any, path: str) -> list[Any]:
        """The expert tensors ``scheme`` stores (:class:`~coreai_partitioner.quantize.schemes.Planned`), named under ``path``.

        Their output channels are axis 1 of ``[E, out, in]`` (experts stored
        ``[E, in, out]`` are clustered transposed).  int4 blocks are of 32 or
        of the largest common divisor of the input width.  Experts already
        stored (:meth:`quantize_experts`: a decoder exported once a method)
        are not planned again.
        """
        from coreai_partitioner.quantize.schemes import Planned, scheme as scheme_of

        found = scheme_of(scheme)
        planned = []
        for name in ("gate_up", "down"):
            if name in self.forms:
                continue
            shape = tuple(self._out_first(getattr(self, name)).shape)
            form = found.linear
            if form.kind == "int" and form.size is not None:
                form = dataclasses.replace(form, size=math.gcd(shape[2], form.size))
            planned.append(Planned(f"{path}.{name}", path, shape, form, axis=1))
        return planned

    def quantize_experts(self, scheme: Any, path: str = "") -> None:
        """Store the experts compressed as ``scheme`` stores a Linear's weight (:meth:`planned`).

        Each expert tensor becomes the buffers of its
        :class:`~coreai_partitioner.quantize.weight_forms.Compressed` form, expanded in
        ``forward`` by its Core AI constexpr op (what the asset keeps
        compressed): per expert, int8/int4 with scales, or a look-up table per
        group of output channels.  The model's own float parameters are left
        as they were, and no longer read.
        """
        from coreai_partitioner.quantize.weight_forms import compress

        for entry in self.planned(scheme, path):
            name = entry.name.rpartition(".")[2]
            compressed = compress(self._out_first(getattr(self, name).detach()), entry.form, axis=1)
            if self.out_axis == 2:
                compressed = compressed.transpose(1, 2)
            for key, tensor in compressed.buffers.items():
                self.register_buffer(f"{name}_{key}", tensor)
            self.forms[name] = compressed.form
            setattr(self, name, None)

    def _experts(self, name: str) -> torch.Tensor:
        if name not in self.forms:
            return getattr(self, name)
        from coreai_partitioner.quantize.weight_forms import Compressed

        buffers = {key: getattr(self, f"{name}_{key}") for key in self.forms[name].buffers}
        return Compressed(self.forms[name], buffers).expand()

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` [N, H] -> the weights [N, k] and int32 indices [N, k] of each token's experts."""
        logits = nn.functional.linear(x, self.router)
        top, index = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float32), self.top_k, dim=-1)
        if self.renormalize:
            top = top / top.sum(dim=-1, keepdim=True)
        return top.to(logits.dtype), index.to(torch.int32)

    def glu(self, gate_up: torch.Tensor, dim: int) -> torch.Tensor:
        """The gated unit of ``gate_up`` (gate, then up, along ``dim``)."""
        gate, up = gate_up.chunk(2, dim=dim)
        return self.act(gate) * up

    def expert_outputs(
        self, tokens: torch.Tensor, pairs: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
    ) -> torch.Tensor:
        """Each ``(token, expert)`` pair's output: ``tokens`` [N * k, H] through expert ``pairs`` [N * k].

        ``gather_mm`` takes each token's expert from axis 0 of the expert
        tensors as they are stored, with no transposed or reshaped copy of
        them: HF's ``[E, out, in]`` multiplies a token as a column (the experts
        gathered as the left operand).
        """
        hidden = self.gather_up(gate_up, tokens.unsqueeze(-1), lhs_indices=pairs)  # [N * k, 2I, 1]
        return self.gather_down(down, self.glu(hidden, -2), lhs_indices=pairs)  # [N * k, H, 1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, index = self.route(flat)
        # One row per (token, expert it takes), [N * k, ...], experts gathered by the flat index: Core AI's
        # batch_matmul does not broadcast a token over its k experts, nor take the gathered [N, k, ...] view
        # (coreai-core 1.0.0b3: "Cannot broadcast shapes [N * k] and [N, k]").  Each token is repeated k
        # times by a broadcasting product, not an expand (see cache._spread).
        pairs = index.reshape(-1)
        copies = torch.ones(1, self.top_k, 1, dtype=flat.dtype, device=flat.device)
        tokens = (flat.unsqueeze(1) * copies).reshape(-1, shape[-1])  # [N * k, H]
        out = self.expert_outputs(tokens, pairs, self._experts("gate_up"), self._experts("down"))
        out = (out.reshape(*index.shape, shape[-1]) * weights.unsqueeze(-1).to(out.dtype)).sum(dim=1)
        return out.view(shape)
