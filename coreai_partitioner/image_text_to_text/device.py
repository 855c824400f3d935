"""The device form of a vision-language model's three methods: what upstream's on-device Core AI runtime runs.

The LLM device form's contract (:mod:`coreai_partitioner.text_decoder.device`),
method by method: ``CoreAIBackend``, inline, one function per delegate of
one shared asset, fp16/fp32 tensor arguments only, nothing as Core AI state.

* ``vision_encoder`` is the host form's: fp32 pixels in, embeddings out, static shapes.
* ``token_embedding`` takes the runner's int64 tokens ``[1, n]``; the program
  casts them to fp32 before the delegate, which casts them back to int32 for
  the gather (the embedding stays inside, one copy, shared with a tied head).
* ``text_decoder`` takes the embeddings and the runner's int64 positions,
  cast to fp32 before the delegate; the caches are the program's mutable
  buffers, read whole and written by row outside the delegate
  (:class:`~coreai_partitioner.text_decoder.device.DeviceStep`), never read where this
  sequence has not written them.

``n`` and ``S`` are bounded-dynamic, 1 to ``prefill_chunk``: the runner gives
each segment (an image's embeddings, a text run) in one call, whatever its
length, and upstream's runtime passes each input with the shape it has and
resizes the outputs (the LLM device form's bounded layout).  A static
layout cannot serve ``MultimodalRunner``, which calls ``text_decoder`` with
each segment's own length.
"""

from __future__ import annotations

import torch

from coreai_partitioner.text_decoder.multimodal import DeviceEmbeddedDecoder


class DeviceVisionLanguage(DeviceEmbeddedDecoder):
    """The device form's ``vision_encoder``, ``token_embedding`` and ``text_decoder`` over a :class:`~.model.VisionLanguage`."""

    def vision_encoder(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model.vision_encoder(pixels)
