"""The gated MLP, and the activations HF names."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from coreai_partitioner.blocks.errors import UnsupportedConfig


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": nn.functional.silu,
    "swish": nn.functional.silu,
    "gelu": nn.functional.gelu,
    "gelu_pytorch_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "relu": nn.functional.relu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}


def activation(name: str, field: str = "hidden_act") -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation HF names ``name`` (``ACT2FN``), or a clear refusal naming ``field``."""
    if name not in ACTIVATIONS:
        raise UnsupportedConfig(field, name, f"one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``; a family with other projections overrides :meth:`gate_and_up`."""

    def __init__(self, act: str, *, gate: nn.Module | None, up: nn.Module | None, down: nn.Module) -> None:
        super().__init__()
        self.gate, self.up, self.down = gate, up, down
        self.act = activation(act)

    def gate_and_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gate(x), self.up(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_and_up(x)
        return self.down(self.act(gate) * up)
