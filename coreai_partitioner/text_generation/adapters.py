"""One base decoder, many LoRA adapters: lowered once, a ``.pte`` per adapter over one shared ``.ptd``.

:func:`~coreai_partitioner.text_generation.export.lower_with_adapters` puts an adapter slot on every linear layer any
of the adapters targets (:mod:`coreai_partitioner.text_decoder.slots`), lowers
the decoder once with the slots' pairs as inputs and the weights in a data
file (``external_data``); :func:`bind_adapters` then binds each adapter's
pairs, and the base's zero pairs, as constants of a program of its own
(:func:`~coreai_partitioner.adapters.bind.bind_inputs`).  Every program calls
the same Core AI asset: the ``.ptd`` holds the base weights once, each
adapter's ``.pte`` holds its own ``A`` and ``B`` and the graph.
:meth:`AdapterPrograms.save` writes ``model.pte``, ``model.ptd`` and
``NAME.pte`` per adapter; ExecuTorch's ``TextLLMRunner(NAME.pte, tokenizer,
data_path=model.ptd)`` runs any of them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from coreai_partitioner.adapters.config import Adapter, AdapterError
from coreai_partitioner.text_decoder.slots import AdapterSlots

logger = logging.getLogger(__name__)

#: The inputs of ``forward`` before the adapter's: ``tokens`` and ``input_pos``.
_RUNNER_INPUTS = 2


@dataclass
class AdapterPrograms:
    """The base program and one per adapter (none: the base alone), all over one lowering's delegates; what
    :meth:`save` writes."""

    base: Any
    adapters: dict[str, Any] = field(default_factory=dict)
    #: Placeholder names of the adapter pairs, per method: they stay in each ``.pte``.
    kept: list[str] = field(default_factory=list)
    slots: AdapterSlots | None = None
    sources: list[Adapter] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)

    def pairs(self, name: str | None = None) -> list[torch.Tensor]:
        """The inputs the base (``None``) or adapter ``name`` binds, in slot order."""
        if self.slots is None:
            return []
        if name is None:
            return self.slots.inputs(self.slots.zero_pairs(self.slots.dtype))
        adapter = next((a for a in self.sources if a.name == name), None)
        if adapter is None:
            raise KeyError(f"no adapter {name!r}; the adapters: {', '.join(self.adapters) or 'none'}")
        return self.slots.inputs(self.slots.pairs_of(adapter, self.slots.dtype))

    def program(self, name: str | None = None) -> Any:
        """The base's (``None``) or adapter ``name``'s ``EdgeProgramManager``."""
        if name is None:
            return self.base
        if name not in self.adapters:
            raise KeyError(f"no adapter {name!r}; the adapters: {', '.join(self.adapters) or 'none'}")
        return self.adapters[name]

    def to_executorch(self, name: str | None = None) -> Any:
        """The serialized program of the base (``None``) or of adapter ``name``, its pairs kept in the ``.pte``."""
        from coreai_partitioner.lowering.lower import to_executorch

        return to_executorch(self.program(name), kept=self.kept)

    def save(self, pte: str | Path) -> dict[str, Path]:
        """``pte`` (the base), its ``.ptd`` beside it, and ``<name>.pte`` per adapter in the same directory (the base
        alone has a ``.ptd`` only if it was lowered with ``external_data``).

        Each adapter's program must have the base's data file, entry for
        entry (the same asset, the same constants); it is checked, not assumed.
        Returns ``{"model": pte, "data": ptd, <name>: path, ...}``.
        """
        from coreai_partitioner import _compat
        from coreai_partitioner.lowering.external_data import write_program

        pte = Path(pte)
        base = self.to_executorch()
        shared = _data_sizes(_compat.tensor_data_files(base))
        written = write_program(base, pte)
        files = {"model": written["pte"], **({"data": written["ptd"]} if "ptd" in written else {})}
        del base
        for name in self.adapters:
            program = self.to_executorch(name)
            own = _data_sizes(_compat.tensor_data_files(program))
            if own != shared:
                raise RuntimeError(f"adapter {name!r}'s program does not run over the base's data file: {own} vs {shared}")
            files[name] = write_program(program, pte.with_name(f"{name}.pte"), with_data=False)["pte"]
        self.files = files
        return files


def _data_sizes(files: Mapping[str, Any]) -> dict[str, int]:
    return {name: len(data) for name, data in files.items()}


def bind_adapters(edge: Any, slots: AdapterSlots, adapters: Sequence[Adapter], shapes: Any) -> AdapterPrograms:
    """``edge`` (lowered with ``slots``' pairs as inputs of ``forward`` after ``tokens`` and ``input_pos``) bound to
    the base's zero pairs and to each adapter's: the :class:`AdapterPrograms` over its delegates."""
    from coreai_partitioner.adapters.bind import bind_inputs
    from coreai_partitioner.lowering.device import check_delegates

    device = edge_is_device(edge)
    kept: list[str] = []

    def bound(pairs: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> Any:
        program = edge
        for method in edge.methods:
            inputs = edge.exported_program(method).graph_signature.user_inputs[_RUNNER_INPUTS:]
            if not inputs:
                continue
            kept.extend(name for name in inputs if name not in kept)
            program = bind_inputs(program, method, dict(zip(inputs, slots.inputs(pairs))), prefix="adapter.")
        if device:
            check_delegates(program, bounded=shapes.prefill_chunk if shapes.bounded else None)
        return program

    base = bound(slots.zero_pairs(slots.dtype))
    programs = {adapter.name: bound(slots.pairs_of(adapter, slots.dtype)) for adapter in adapters}
    logger.info("lowered once for %d adapter(s) over %d slot(s), rank up to %d", len(adapters), len(slots.layers), slots.max_rank)
    return AdapterPrograms(base, programs, kept, slots, list(adapters))


def check_adapters(adapters: Sequence[Adapter], shapes: Any, max_rank: int | None) -> int:
    """Refuse what a lowering with ``adapters`` cannot take, before any work; the largest rank a slot takes."""
    if not shapes.device and shapes.mode != "dynamic":
        raise AdapterError(
            f"adapters take the host form's dynamic shapes (each adapter's rank is a dimension of the program); "
            f"shapes {shapes.mode!r} enumerate static functions: export with --shapes dynamic"
        )
    names = [adapter.name for adapter in adapters]
    duplicated = {name for name in names if names.count(name) > 1}
    if duplicated:
        raise AdapterError(f"two adapters are named {sorted(duplicated)[0]!r}; name them apart with NAME=DIR")
    largest = max((layer.rank for adapter in adapters for layer in adapter.layers.values()), default=1)
    if max_rank is not None and max_rank < largest:
        raise AdapterError(f"max_rank={max_rank} is below the adapters' largest rank, {largest}")
    return max_rank or largest


class WithPairs(nn.Module):
    """A quantized program's eager module (``lower_decoder``'s ``quantized_reference``, which takes each slot's pair
    as inputs) called with one program's pairs: the decoder step ``check.eager_logits`` feeds, its compressed
    weights expanded once."""

    def __init__(self, module: nn.Module, inputs: Sequence[torch.Tensor]) -> None:
        from coreai_partitioner.quantize.weight_forms import expand_weights

        super().__init__()
        self.module = expand_weights(module)
        self.inputs = list(inputs)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return self.module(tokens, input_pos, *self.inputs)


def edge_is_device(edge: Any) -> bool:
    """Whether ``edge``'s delegates carry the id upstream's device runtime registers."""
    from coreai_partitioner.lowering.device import DEVICE_BACKEND_ID, lowered_modules

    return any(module.backend_id == DEVICE_BACKEND_ID for _, module in lowered_modules(edge))
