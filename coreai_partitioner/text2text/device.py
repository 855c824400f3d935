"""The device form of ``encoder``: what upstream's stock on-device Core AI runtime runs.

The same contract as every device form (:mod:`coreai_partitioner.lowering.device`):
only fp16/fp32 tensors across a delegate, no Core AI state.  ``text_decoder``
is the speech device form's (:class:`~coreai_partitioner.text_decoder.device.DeviceTextDecoder`:
the caches ExecuTorch's, each call's rows written outside the delegate,
unwritten slots read as zeros), its relative position bias taking the call's
own rows at the call's position (:class:`~.t5.BiasedSelfAttention`).
``encoder`` takes int64 token ids, so its ids cross as fp32, as the LLM
device form's do (exact below 2**24), and are cast to int32 inside for the
embedding gather.  ``T`` stays bounded-dynamic: the ``.pte`` declares
``max_input_len`` and the runtime passes each input with the shape it has.
"""

from __future__ import annotations

import torch
from torch import nn

from coreai_partitioner.partition.boundaries import outside_delegate


class DeviceEncoder(nn.Module):
    """``encoder(input_ids [1, T] int64) -> cross``, device form: the ids cross the delegate as fp32."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        with outside_delegate():
            ids = input_ids.to(torch.float32)
        return self.encoder(ids.to(torch.int32))
