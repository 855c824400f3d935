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
  replaced by zeros by a selection (:func:`~coreai_partitioner.blocks.written_only`)
  before they are attended, and masked: the LLM device form's step
  (:class:`~coreai_partitioner.text_decoder.device.DeviceStep`), whose caches are these.
* **Ids and positions cross as fp32**, as the LLM device form carries them:
  the program casts its int64 ``ids`` and ``cache_position`` before the
  delegate; the delegate casts them to int32 for the embedding and position
  gathers, so both tables stay inside with one copy of their weights.

The module is :class:`~coreai_partitioner.text_decoder.device.DeviceTextDecoder`,
beside the LLM's device form: text2text's ``text_decoder`` takes the same.
"""

from __future__ import annotations

from coreai_partitioner.text_decoder.device import DeviceTextDecoder

__all__ = ["DeviceTextDecoder"]
