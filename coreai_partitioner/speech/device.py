"""The device form of ``text_decoder``: what upstream's stock on-device Core AI runtime runs.

The same contract as every device form (:mod:`coreai_partitioner.lowering.device`):
backend id ``CoreAIBackend``, only fp16/fp32 tensors across a delegate, no
Core AI state.  ``encoder`` is stateless and takes and returns floats, so it
is the same in both forms.  ``text_decoder`` changes where things live:

* **ExecuTorch owns the self-attention caches.**  They stay mutable buffers
  of the program, passed to the delegate whole; the delegate returns the
  call's key and value rows, which the program writes into the buffers at
  ``cache_position`` outside the delegate (``index_copy_``, in place).
* **Nothing reads a slot this utterance has not written.**  ExecuTorch
  gives mutable buffers no initial value (1.5.1 was seen to leave NaN bit
  patterns in an fp16 cache after another method of the program ran), and
  SDPA masks a slot by adding a large negative score and then weights its
  value: ``0 * NaN`` is NaN.  So the slots at or past the call's position are
  replaced by zeros by a selection (:func:`~coreai_partitioner.llm.blocks.written_only`)
  before they are attended, and masked.
* **Ids and positions cross as fp32**, as the LLM device form carries them:
  the program casts its int64 ``ids`` and ``cache_position`` before the
  delegate; the delegate casts them to int32 for the embedding and position
  gathers, so both tables stay inside with one copy of their weights.
"""

from __future__ import annotations

import torch
from torch import nn

from coreai_partitioner.llm.blocks import Step, written_only
from coreai_partitioner.partition.boundaries import outside_delegate


class DeviceCacheStep(Step):
    """A :class:`~coreai_partitioner.llm.blocks.Step` whose caches are the program's: read whole, written outside.

    ``positions`` are the call's positions in fp32 (the delegate's input),
    ``slots`` the same as the program's int64 ``cache_position``, which only
    the writes outside the delegate read.
    """

    def __init__(self, decoder: nn.Module, positions: torch.Tensor, slots: torch.Tensor) -> None:
        super().__init__(decoder, positions)
        self.slots = slots

    def _held(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[length]`` bool, the slots an earlier call of this utterance wrote (those before the call's first
        position); and the mask ``[1, 1, T, length + T]`` over those slots then the call's own tokens, causal."""

        def make():
            slots = torch.arange(length, dtype=self.positions.dtype, device=self.positions.device)
            held = slots < self.positions.min()
            keys = torch.cat([torch.where(held, slots, torch.full_like(slots, -1.0)), self.positions])
            mask = (keys >= 0.0) & (keys <= self.positions.unsqueeze(-1))
            return held, mask[None, None]

        return self.memoized(("held", length), make)

    def full_cache(self, key_cache, value_cache, k, v):
        """The written slots (the rest zeros) then the call's own rows, and their mask; the rows written into
        the caches outside the delegate."""
        held, mask = self._held(key_cache.shape[2])
        keys = torch.cat([written_only(key_cache, held), k.to(key_cache.dtype)], dim=2)
        values = torch.cat([written_only(value_cache, held), v.to(value_cache.dtype)], dim=2)
        # The delegate returns the rows in the default dim order, which upstream's runtime requires.
        k = k.to(key_cache.dtype).clone(memory_format=torch.contiguous_format)
        v = v.to(value_cache.dtype).clone(memory_format=torch.contiguous_format)
        with outside_delegate():
            key_cache.index_copy_(2, self.slots, k)
            value_cache.index_copy_(2, self.slots, v)
        return keys, values, mask

    def ring_cache(self, size, key_cache, value_cache, k, v):
        raise NotImplementedError("Whisper's decoder has no sliding window")


class DeviceTextDecoder(nn.Module):
    """``text_decoder(ids [1, 1] int64, cross, cache_position [1] int64) -> logits``, device form."""

    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, ids: torch.Tensor, cross: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        with outside_delegate():
            ids = ids.to(torch.float32)
            positions = cache_position.to(torch.float32)
        step = DeviceCacheStep(self.decoder, positions, cache_position)
        return self.decoder.run(ids.to(torch.int32), positions.to(torch.int32), cross, step)
