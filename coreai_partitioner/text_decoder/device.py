"""The device form of a decoder: what ExecuTorch's stock on-device Core AI runtime runs.

Upstream's device runtime (ExecuTorch main, ``backends/apple/coreai/runtime/``)
registers ``CoreAIBackend``, runs one asset ``function`` per delegate, takes
only fp16/fp32 tensor arguments and refuses Core AI state.  The host form
(:func:`~.export.lower_decoder`'s default) keeps the caches as delegate state
and takes int tokens; this form keeps the same decoder and changes where
things live:

* **ExecuTorch owns every cache and state.**  They stay mutable buffers of
  the program (``take_over_mutable_buffer=False``), passed to the delegate
  as fp16/fp32 inputs.  A KV cache is read whole and the delegate returns
  only the call's new rows ``[1, kv_heads, T, head_dim]``, which the program
  writes into the buffer at their slots (``index_put`` on ExecuTorch's
  portable kernels, in place: :func:`executorch_config`), ExecuTorch's
  static-attention convention.  Small states (a recurrent state, a conv
  window) come back whole and ExecuTorch copies them into their buffers.
* **Nothing depends on memory never written.**  ExecuTorch gives mutable
  buffers no initial value, and its runtime does not always zero them (a
  slot may hold NaN).  A call attends only the slots this sequence wrote,
  and reads every other slot as zero by selection
  (:func:`~.blocks.written_only`; the SDPA composite's mask is added to the
  scores, and ``0 * NaN`` is NaN); a recurrent state at position 0 is
  replaced by zeros (:meth:`~.blocks.Step.carry`), and a sliding ring's slot
  positions follow from the call's first position
  (:func:`~.blocks.ring_positions_before`).
* **Tokens and positions cross as fp32.**  The program casts its int64
  ``tokens`` and ``input_pos`` to fp32 before the delegate (fp32 holds every
  integer below 2**24 exactly; fp16 only up to 2048); the delegate casts the
  tokens back to int32 for the embedding gather, so the embedding (and a tied
  lm_head) stay inside with their one copy of the weights.
* **Shapes** (:attr:`~.export.DecoderShapes.device_shapes`).  ``bounded``
  (default): one method ``forward`` whose ``T`` runs from 1 to
  ``prefill_chunk``, a bounded-dynamic dimension (the ``.pte`` declares the
  bound; upstream's runtime passes each input with the shape it has and
  resizes the outputs to what Core AI returns), and ``enable_dynamic_shape``
  true, so ExecuTorch's ``TextLLMRunner`` prefills a prompt in calls of
  ``prefill_chunk`` tokens.  ``static``: ``forward`` takes one token,
  ``prefill`` exactly ``prefill_chunk``, both functions of one Core AI asset
  (``share_asset``), stored once; a prompt goes in whole chunks and the rest
  one token a call (:func:`~.generate.prefill_calls`), and ``TextLLMRunner``
  feeds it token by token.  No padding either way, so recurrent layers see
  only real tokens.
* **Backend id ``CoreAIBackend``.**  The payload is upstream's (inline
  packaging, manifest v2, ``runtime_supported`` true), so the delegates carry
  the id the device runtime registers; this package's host runtime registers
  the same id.

What a decode step copies: the token and position in (8 bytes); inside the
delegate, each layer's cache concatenated with its new rows (a copy of the
whole cache every call, as ExecuTorch's static-attention Core ML Llama makes);
the new K/V rows and small states out of the delegate, and those rows into
the caches (``benchmarks/decode_copies.py`` counts the bytes).  What crosses a
delegate, the backend id and the memory plan are the device contract's
(:mod:`coreai_partitioner.lowering.device`: :func:`~coreai_partitioner.lowering.device.check_delegates`
reads the boundary back off the lowered program and refuses anything else).
"""

from __future__ import annotations

import torch
from torch import nn

from coreai_partitioner.partition.boundaries import outside_delegate, segment
from coreai_partitioner.blocks import Attention, Step, WindowPlan, ring_positions_before, window_plan, written_only
from coreai_partitioner.blocks.quantized_cache import quantize_rows

class DeviceStep(Step):
    """A :class:`~.blocks.Step` whose KV caches are the program's: read whole, written outside by row.

    ``positions`` are fp32 (the delegate's input), ``slots`` the same
    positions as the program's int64 ``input_pos``, which only the writes
    outside the delegate read.
    """

    writes_stash_in_every_call = False  # the stashes are the program's buffers, shared by name between methods

    def __init__(
        self, decoder: nn.Module, positions: torch.Tensor, slots: torch.Tensor, layers_per_delegate: int | None = None,
        verifying: bool = False,
    ) -> None:
        super().__init__(decoder, positions, verifying=verifying)
        self.slots = slots
        self.layers_per_delegate = layers_per_delegate

    def before_layer(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        """A graph break before every ``layers_per_delegate``-th layer: a copy outside the delegates.

        What the layers share (masks, RoPE tables, window plans) is made again
        in each delegate from the fp32 positions, so only the hidden state
        (and the positions) cross.
        """
        if not self.layers_per_delegate or index == 0 or index % self.layers_per_delegate:
            return hidden
        self._memo.clear()
        with outside_delegate():
            return hidden.clone()

    def scope(self, index: int):
        """Layer ``index``'s ops belong to delegate ``index // layers_per_delegate`` (:func:`~..boundaries.segment`)."""
        return segment(index // self.layers_per_delegate) if self.layers_per_delegate else super().scope(index)

    def _held(self, length: int) -> torch.Tensor:
        """``[length]`` bool: a full cache's slots this sequence wrote before the call (those before its first position)."""

        def make():
            slots = torch.arange(length, dtype=self.positions.dtype, device=self.positions.device)
            return slots < self.positions.min()

        return self.memoized(("held", length), make)

    def _old_and_new_mask(self, length: int) -> torch.Tensor:
        """``[1, 1, T, length + T]``: a full cache's slots before the call's first position, then its own causally."""

        def make():
            held = self._held(length)
            query = self.positions.unsqueeze(-1)
            return torch.cat([held.expand(query.shape[0], length), self.positions <= query], dim=-1)[None, None]

        return self.memoized(("old_and_new_mask", length), make)

    def full_cache(self, key_cache, value_cache, k, v):
        held = self._held(key_cache.shape[2])
        keys = torch.cat([written_only(key_cache, held), k.to(key_cache.dtype)], dim=2)
        values = torch.cat([written_only(value_cache, held), v.to(value_cache.dtype)], dim=2)
        self._write_rows(key_cache, value_cache, k, v, self.slots)
        return keys, values, self._old_and_new_mask(key_cache.shape[2])

    def window(self, size: int) -> WindowPlan:
        """The ring's plan from the call's first position alone: no slot-position state.

        The program keeps no state it would have to ship a value for
        (ExecuTorch gives mutable buffers no initial value): the device form's
        calls write every position from 0 on, in order, so the ring's slot
        positions follow from the call's first position (:func:`~.blocks.ring_positions_before`).
        """

        def make():
            ring = self.decoder.window_positions(size).shape[0]  # the window's slots and a verify call's spare ones
            slot_positions = ring_positions_before(self.positions.min(), ring)
            return window_plan(slot_positions, self.positions, size, self.decoder.context)

        return self.memoized(("window", size), make)

    def finish(self) -> None:
        """Only the recurrent stashes' positions: the ring's slot positions follow from the positions (:meth:`window`)."""
        self.finish_stashes()

    def ring_cache(self, size, key_cache, value_cache, k, v):
        plan = self.window(size)
        keys = torch.cat([written_only(key_cache, plan.held), k.to(key_cache.dtype)], dim=2)
        values = torch.cat([written_only(value_cache, plan.held), v.to(value_cache.dtype)], dim=2)
        with outside_delegate():
            slots = torch.remainder(self.slots, key_cache.shape[2])
        self._write_rows(key_cache, value_cache, k, v, slots)  # T <= window <= ring (check_device): no slot twice
        return keys, values, plan.mask

    def int8_full_cache(self, caches, k, v):
        """:meth:`full_cache` over int8 caches: each crosses as the scales' dtype (upstream's runtime takes fp16/fp32
        only: a cast outside the delegate), is dequantized inside, and the call's rows are quantized inside and
        written outside as int8.  An int8 value is finite whatever the memory held: only the scales, ``[L, 1]`` a
        head, are read through :func:`~.blocks.written_only`."""
        held = self._held(caches.keys.shape[2])
        keys = self._int8_read_write(caches.keys, caches.key_scales, k, held, self.slots)
        values = self._int8_read_write(caches.values, caches.value_scales, v, held, self.slots)
        return keys, values, self._old_and_new_mask(caches.keys.shape[2])

    def int8_ring_cache(self, size, caches, k, v):
        plan = self.window(size)
        with outside_delegate():
            slots = torch.remainder(self.slots, caches.keys.shape[2])  # the ring: its window and spare slots
        keys = self._int8_read_write(caches.keys, caches.key_scales, k, plan.held, slots)
        values = self._int8_read_write(caches.values, caches.value_scales, v, plan.held, slots)
        return keys, values, plan.mask

    @staticmethod
    def _int8_read_write(cache, scales, rows, held, slots) -> torch.Tensor:
        """The int8 ``cache`` dequantized (unwritten slots zero), then the call's ``rows`` as the cache will hold
        them; the rows quantized inside and written at ``slots`` outside."""
        dtype = scales.dtype
        values, scale = quantize_rows(rows.to(dtype))
        with outside_delegate():
            old = cache.to(dtype)
        attended = torch.cat([old * written_only(scales, held), values * scale], dim=2)
        values, scale = _default_order(values), _default_order(scale)
        with outside_delegate():
            cache.index_copy_(2, slots, values.to(torch.int8))
            scales.index_copy_(2, slots, scale)
        return attended

    @staticmethod
    def _write_rows(key_cache, value_cache, k, v, slots) -> None:
        # Inside: the delegate returns the rows, in the default dim order upstream's runtime requires.
        k, v = _default_order(k.to(key_cache.dtype)), _default_order(v.to(value_cache.dtype))
        with outside_delegate():
            key_cache.index_copy_(2, slots, k)
            value_cache.index_copy_(2, slots, v)


def _default_order(t: torch.Tensor) -> torch.Tensor:
    """``t`` with row-major strides, size-1 dims included (``contiguous()`` keeps a transposed view's strides there)."""
    return t.clone(memory_format=torch.contiguous_format)


class DeviceDecoder(nn.Module):
    """``forward(tokens [1, T] int64, input_pos [T] int64) -> logits`` of a :class:`~.decoder.Decoder`, device form."""

    def __init__(self, decoder: nn.Module, layers_per_delegate: int | None = None) -> None:
        super().__init__()
        self.decoder = decoder
        self.layers_per_delegate = layers_per_delegate

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        with outside_delegate():
            tokens = tokens.to(torch.float32)
            positions = input_pos.to(torch.float32)
        step = DeviceStep(self.decoder, positions, input_pos, self.layers_per_delegate, self.decoder.verifying)
        return self.decoder.run(tokens.to(torch.int32), step)


class DeviceTextDecoder(nn.Module):
    """``text_decoder(ids [1, 1] int64, cross, cache_position [1] int64) -> logits`` of an encoder-decoder's text
    decoder (speech's, text2text's: a ``run(ids, positions, cross, step)``), device form.

    The same step as :class:`DeviceDecoder`'s: the caches ExecuTorch's, the
    call's rows written outside the delegate at ``cache_position``, unwritten
    slots read as zeros; the ids and positions cross as fp32 and are cast to
    int32 inside for the embedding and position gathers
    (:mod:`coreai_partitioner.speech_recognition.device` tells the whole of it).
    """

    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, ids: torch.Tensor, cross: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        with outside_delegate():
            ids = ids.to(torch.float32)
            positions = cache_position.to(torch.float32)
        step = DeviceStep(self.decoder, positions, cache_position)
        return self.decoder.run(ids.to(torch.int32), positions.to(torch.int32), cross, step)


class UnsupportedDevice(ValueError):
    """A model or shape the device form cannot take; names it and the fix."""


def sliding_windows(decoder: nn.Module) -> list[int]:
    """The sizes of ``decoder``'s sliding windows, smallest first: the device form's longest prefill chunk is the first."""
    return sorted({m.window for m in decoder.modules() if isinstance(m, Attention) and m.window})


def check_device(decoder: nn.Module, prefill_chunk: int, layers_per_delegate: int | None = None) -> None:
    """Refuse, before any export work, what the device form cannot honour.

    A sliding layer's ring takes a call's rows at ``position % window``: a
    prefill chunk longer than the window would write a slot twice in one call.
    Graph breaks need a whole number of layers per delegate, below the
    layer count, and no layer that attends another's keys (KV sharing: its
    mask would cross a delegate boundary as a bool tensor).
    """
    if layers_per_delegate is not None:
        layers = len(decoder.layers)
        if not 1 <= layers_per_delegate < layers:
            raise UnsupportedDevice(
                f"{decoder.model_type}: graph breaks every {layers_per_delegate} layer(s) of {layers}: give 1 to {layers - 1}"
            )
        if any(isinstance(m, Attention) and m.borrows_keys for m in decoder.modules()):
            raise UnsupportedDevice(
                f"{decoder.model_type}: its shared-KV layers attend an earlier layer's keys and mask, which a graph "
                "break would pass between delegates as a bool tensor; export it without --graph-breaks"
            )
    windows = sliding_windows(decoder)
    if windows and prefill_chunk > windows[0]:
        raise UnsupportedDevice(
            f"{decoder.model_type}: the device form writes a prefill chunk's rows into each sliding window's ring "
            f"at once, and prefill_chunk {prefill_chunk} is longer than its smallest window ({windows[0]}); "
            f"export with --prefill-chunk {windows[0]} or less"
        )


