"""Adapter slots: a model's targeted linear layers computing ``W x + (x Aᵀ) Bᵀ`` with ``A`` and ``B`` as program inputs.

:func:`adapter_slots` replaces each ``nn.Linear`` of the base model (or
PEFT's LoRA layer around it) that LoRA adapters target by a
:class:`LowRankLinear` over the same weight and bias, for as long as the
``with`` block lasts; the model is given back as it was.
:class:`AdapterInputs` is the module exported: the model's own call with two
inputs more per slot, ``A [r, in]`` and ``B [out, r]``, each rank a dimension
of the program (1 to :attr:`AdapterSlots.max_rank`), so one lowering serves
every adapter and the base (a zero pair of rank 1).  A call that leaves a
slot uncalled (a family reading the layer's weight) is refused, naming the
layer: its adapter would be dropped.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from coreai_partitioner.adapters.config import Adapter, AdapterError


class LowRankLinear(nn.Linear):
    """``base(x) + (x Aᵀ) Bᵀ``: the base layer's own weight and bias, the pair set for each call by :class:`AdapterInputs`."""

    def __init__(self, base: nn.Linear, path: str) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias  # the same parameters: the base's names, stored once
        self.path = path
        self.pair: tuple[torch.Tensor, torch.Tensor] | None = None
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = super().forward(x)
        if self.pair is None:
            return y
        a, b = self.pair
        return y + ((x.to(a.dtype) @ a.t()) @ b.t()).to(y.dtype)


@dataclass
class AdapterSlots:
    """The slots of one model: its :class:`LowRankLinear` layers by module path, the largest rank they take, and
    the model's floating dtype (the pairs')."""

    layers: dict[str, LowRankLinear]
    max_rank: int
    dtype: torch.dtype

    def inputs(self, pairs: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """The program's adapter inputs in slot order: ``A``, ``B`` of each layer from ``pairs``."""
        return [tensor for path in self.layers for tensor in pairs[path]]

    def zero_pairs(self, dtype: torch.dtype, rank: int = 1) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """A pair of zeros of ``rank`` for every slot: the base model's output, exactly."""
        return {
            path: (torch.zeros(rank, layer.in_features, dtype=dtype), torch.zeros(layer.out_features, rank, dtype=dtype))
            for path, layer in self.layers.items()
        }

    def pairs_of(self, adapter: Adapter, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``adapter``'s ``A`` and ``B · scale`` in ``dtype`` for every slot; a rank-1 zero pair where it has no layer."""
        self.check_takes(adapter)
        pairs = self.zero_pairs(dtype)
        pairs.update({path: layer.scaled(dtype) for path, layer in adapter.layers.items()})
        return pairs

    def check_takes(self, adapter: Adapter) -> None:
        """Raise unless every layer ``adapter`` targets has a slot."""
        missing = set(adapter.layers) - set(self.layers)
        if missing:
            raise AdapterError(f"{adapter.source} targets {sorted(missing)[0]}, which has no slot in this program")

    @property
    def sample_rank(self) -> int:
        """The rank the program is traced at: 2 where it may vary (torch specializes a dimension traced at 1)."""
        return min(2, self.max_rank)

    def dynamic_shapes(self) -> list[dict[int, Any] | None]:
        """``torch.export`` dynamic shapes of the inputs: each slot's rank a dimension of its own, 1 to ``max_rank``
        (static at 1 when ``max_rank`` is 1)."""
        if self.max_rank == 1:
            return [None] * (2 * len(self.layers))
        shapes: list[dict[int, Any] | None] = []
        for index in range(len(self.layers)):
            rank = torch.export.Dim(f"lora_rank_{index}", min=1, max=self.max_rank)
            shapes += [{0: rank}, {1: rank}]
        return shapes

    def input_names(self) -> list[str]:
        """A name per adapter input, in order: ``<module path>.lora_A`` / ``.lora_B``."""
        return [f"{path}.lora_{matrix}" for path in self.layers for matrix in "AB"]


class AdapterInputs(nn.Module):
    """``module(*arguments, *adapter)``: ``module``'s call, each slot's pair taken from the inputs after its own.

    ``forward`` has an explicit signature (``arguments``' names, then
    ``<module path>_lora_A`` and ``_lora_B`` per slot): every exporter
    (torch.export, coreai-opt's) binds flat, named inputs, and the
    program's placeholders say which layer each pair belongs to.
    """

    def __init__(self, module: nn.Module, slots: AdapterSlots, arguments: Sequence[str]) -> None:
        super().__init__()
        self.decoder = module
        self.slots = slots
        self.arguments = len(arguments)
        names = [*arguments, *(name.replace(".", "_") for name in slots.input_names())]

        def forward(*inputs: torch.Tensor) -> Any:
            return self.call(*inputs)

        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        forward.__signature__ = inspect.Signature([inspect.Parameter(name, kind) for name in names])  # type: ignore[attr-defined]
        self.forward = forward

    def call(self, *inputs: torch.Tensor) -> Any:
        args, adapter = inputs[: self.arguments], inputs[self.arguments :]
        layers = list(self.slots.layers.values())
        for index, layer in enumerate(layers):
            layer.pair, layer.calls = (adapter[2 * index], adapter[2 * index + 1]), 0
        try:
            result = self.decoder(*args)
        finally:
            for layer in layers:
                layer.pair = None
        unread = [layer.path for layer in layers if not layer.calls]
        if unread:
            raise AdapterError(
                f"the decoder never calls {unread[0]} as a layer (it reads its weight), so an adapter on it would be "
                f"dropped ({2 * len(unread)} input(s) unread); leave that module out of target_modules"
            )
        return result


@contextlib.contextmanager
def adapter_slots(model: nn.Module, adapters: Sequence[Adapter], max_rank: int) -> Iterator[AdapterSlots]:
    """Slots on every layer of ``model`` one of ``adapters`` targets while the block runs; ``model`` is given back
    as it was.

    A targeted path may name an ``nn.Linear`` or PEFT's LoRA layer around one
    (its base layer takes the slot; PEFT's own pair is not used).  Every
    adapter's layers are checked to have a slot before the block runs.
    """
    targeted = {path for adapter in adapters for path in adapter.layers}
    paths = [path for path, _ in model.named_modules() if path in targeted]
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    originals: list[tuple[nn.Module, str, nn.Module]] = []
    layers: dict[str, LowRankLinear] = {}
    try:
        for path in paths:
            parent_path, _, child = path.rpartition(".")
            parent = model.get_submodule(parent_path) if parent_path else model
            module = getattr(parent, child)
            base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
            if type(base) is not nn.Linear:
                raise AdapterError(f"{path} is {type(base).__name__}, not nn.Linear: only linear layers take an adapter")
            layers[path] = LowRankLinear(base, path)
            originals.append((parent, child, module))
            setattr(parent, child, layers[path])
        slots = AdapterSlots(layers, max_rank, dtype)
        for adapter in adapters:
            slots.check_takes(adapter)  # before the lowering
        yield slots
    finally:
        for parent, child, module in reversed(originals):
            setattr(parent, child, module)
