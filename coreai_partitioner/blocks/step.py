"""One ``forward`` call, as every layer of the decoder sees it: :class:`Step`.

A step holds what every layer of one call shares: the positions, RoPE's cos
and sin per table, the attention masks and the KV cache write plans, each
made once (:meth:`Step.memoized`).  It also decides how a cache is read and
written (:meth:`Step.full_cache`, :meth:`Step.ring_cache`): the host form's
caches are the delegate's state, written in place; the device form's step
(:class:`~coreai_partitioner.text_decoder.device.DeviceStep`) reads them whole and
writes the new rows outside the delegate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from coreai_partitioner.blocks.cache import WindowPlan, ring_write, window_plan, write_at, write_plan
from coreai_partitioner.blocks.quantized_cache import QuantizedKV, quantize_rows


class Step:
    """What every layer of one ``forward(tokens, input_pos)`` call shares; built once per call.

    Positions at or past ``context`` are padding (enumerated shapes pad a
    short prompt in front with them): they write no cache slot and no query
    of a real token attends them.
    """

    def __init__(
        self, decoder: nn.Module, input_pos: torch.Tensor, dtype: torch.dtype | None = None, verifying: bool = False
    ) -> None:
        self.decoder = decoder
        self.positions = input_pos
        #: A verify call (:mod:`coreai_partitioner.text_decoder.verify`): each recurrent layer keeps its state
        #: after every position (:meth:`keep`), so the next call goes on after any number of accepted drafts.
        self.verifying = verifying
        #: The activations' dtype (RoPE's tables are made in it); the decoder sets it from its embedding.
        self.dtype = dtype
        self._memo: dict = {}
        #: What a layer leaves for later layers of the same call, by name (Gemma 4's shared keys and values,
        #: its per-layer inputs).
        self.left: dict = {}

    def memoized(self, key, make: Callable):
        """The value ``make()`` gives, made once per call under ``key`` (masks, RoPE tables, plans every layer shares)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def rope(self, table: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.memoized(("rope", table), lambda: self.decoder.rope_tables[table](self.positions, self.dtype))

    def carry(self, state: torch.Tensor, stash: torch.Tensor | None = None) -> torch.Tensor:
        """``state`` where the call goes on from an earlier one, zeros where it starts at position 0.

        A recurrent layer's state is what its earlier calls left; a call at
        position 0 (a new prompt, or ExecuTorch's runner after ``reset()``)
        starts from nothing, as the KV cache's slots are written from 0 again.
        After a verify call, ``stash`` (``[verify_len, *state.shape]``, :func:`~.recurrent.add_stashes`) holds
        the state after each of its positions: a call going on from one of them (some drafts accepted) starts
        from that row instead.
        """
        goes_on = self.memoized("goes_on", lambda: self.positions[:1] > 0)
        if stash is not None:
            stashed = self.decoder.stash_positions_state  # each row's position plus one; 0: no row
            hits = self.memoized("stashed", lambda: stashed == self.positions[:1].to(stashed.dtype))
            rows = hits.view(-1, *([1] * state.dim()))
            # A selection, not a product (0 * NaN is NaN); every op a Core AI op, so the delegate keeps it.
            chosen = torch.where(rows, stash, torch.zeros((), dtype=stash.dtype)).sum(0)
            state = torch.where(hits.any(), chosen, state)
        return torch.where(goes_on, state, torch.zeros_like(state))  # not a product: 0 * NaN is NaN

    #: Whether a call other than verify writes a stash's first row all the same (no row is read after it).  In the
    #: host form a Core AI function's state is a buffer its method writes: a stash ``forward`` only read would be
    #: lowered as a constant of its own, never seeing what ``verify`` wrote.  The device form's buffers are
    #: ExecuTorch's, one per name whatever each method does with it.
    writes_stash_in_every_call = True

    def keep(self, state: torch.Tensor, stash: torch.Tensor | None, states: torch.Tensor) -> None:
        """Write a recurrent layer's new state: the last of ``states`` (``[T, *state.shape]``, after each position)
        into ``state``, and in a verify call all of them into ``stash`` (else its first row, in the host form:
        :attr:`writes_stash_in_every_call`)."""
        state.copy_(states[-1])
        if stash is None:
            return
        if self.verifying:
            stash.copy_(states)
        elif self.writes_stash_in_every_call:
            stash[:1].copy_(states[-1:])

    def full_mask(self, length: int) -> torch.Tensor:
        """``[1, 1, T, length]``: a query attends every cache slot at or before its position."""

        def make():
            slots = torch.arange(length, dtype=self.positions.dtype, device=self.positions.device)
            return (slots <= self.positions.view(-1, 1))[None, None]

        return self.memoized(("full_mask", length), make)

    def write_plan(self, shape: torch.Size, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The one-hot write of this call's positions into a full cache of ``shape`` [B, H, L, D]."""
        return self.memoized(("write", tuple(shape), dtype), lambda: write_plan(self.positions, shape, dtype))

    def window(self, size: int) -> WindowPlan:
        """The plan of a sliding window of ``size`` slots (:class:`WindowPlan`), shared by its layers."""

        def make():
            slot_positions = self.decoder.window_positions(size)
            return window_plan(slot_positions, self.positions.float(), size, self.decoder.context)

        return self.memoized(("window", size), make)

    def before_layer(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        """The hidden state layer ``index`` takes: as it is here (a device step may break the graph there)."""
        return hidden

    def scope(self, index: int):
        """A context layer ``index`` runs in (a device step marks which delegate its ops go to)."""
        return contextlib.nullcontext()

    def full_cache(
        self, key_cache: torch.Tensor, value_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write this call's ``k``, ``v`` [B, H, T, D] into a full cache (a slot per position); the keys,
        values and mask [1, 1, T, L] to attend."""
        plan = self.write_plan(key_cache.shape, key_cache.dtype)
        keys = write_at(key_cache, k, plan)
        values = write_at(value_cache, v, plan)
        key_cache.copy_(keys)
        value_cache.copy_(values)
        return keys, values, self.full_mask(key_cache.shape[2])

    def ring_cache(
        self, size: int, key_cache: torch.Tensor, value_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ring's keys and values then the call's own, and their mask [1, 1, T, size + T]; the call's
        last ``size`` tokens written into the ring (:func:`window_plan`)."""
        plan = self.window(size)
        keys = torch.cat([key_cache, k.to(key_cache.dtype)], dim=2)
        values = torch.cat([value_cache, v.to(value_cache.dtype)], dim=2)
        key_cache.copy_(ring_write(key_cache, k, plan))
        value_cache.copy_(ring_write(value_cache, v, plan))
        return keys, values, plan.mask

    def int8_full_cache(self, caches: QuantizedKV, k: torch.Tensor, v: torch.Tensor):
        """:meth:`full_cache` over int8 caches (:mod:`~.quantized_cache`): the call's rows quantized and written,
        the whole cache dequantized to attend."""
        plan = self.write_plan(caches.keys.shape, caches.dtype)
        keys = _int8_write(caches.keys, caches.key_scales, k, lambda cache, rows: write_at(cache, rows, plan))
        values = _int8_write(caches.values, caches.value_scales, v, lambda cache, rows: write_at(cache, rows, plan))
        return keys, values, self.full_mask(caches.keys.shape[2])

    def int8_ring_cache(self, size: int, caches: QuantizedKV, k: torch.Tensor, v: torch.Tensor):
        """:meth:`ring_cache` over int8 rings: the ring dequantized, then the call's own rows as the ring will
        hold them (quantized and dequantized), and their mask; the call's last ``size`` tokens written."""
        plan = self.window(size)
        attended = []
        for cache, scales, rows in ((caches.keys, caches.key_scales, k), (caches.values, caches.value_scales, v)):
            values, scale = quantize_rows(rows.to(caches.dtype))
            ring = cache.to(caches.dtype) * scales
            attended.append(torch.cat([ring, values * scale], dim=2))
            cache.copy_(ring_write(cache.to(caches.dtype), values, plan).to(torch.int8))
            scales.copy_(ring_write(scales, scale, plan))
        return attended[0], attended[1], plan.mask

    def sink_cache(self, attention: nn.Module, k: torch.Tensor, v: torch.Tensor):
        """``attention``'s cache of sink tokens and a ring of recent ones (:mod:`~.sinks`): the cache's keys (the
        sinks turned to their place in the cache) and values, then the call's own, and their mask; the call's rows
        written at their slots."""
        from coreai_partitioner.blocks.sinks import re_rotate, sink_plan

        key_cache, value_cache = attention.key_cache, attention.value_cache
        size = key_cache.shape[2]
        plan = self.memoized(("sinks", attention.sinks, size), lambda: sink_plan(self.positions.float(), attention.sinks, size))
        keys = torch.cat([re_rotate(attention, key_cache, plan.shift, self), k.to(key_cache.dtype)], dim=2)
        values = torch.cat([value_cache, v.to(value_cache.dtype)], dim=2)
        key_cache.copy_(ring_write(key_cache, k, plan))  # a one-hot write, as a sliding ring's
        value_cache.copy_(ring_write(value_cache, v, plan))
        return keys, values, plan.mask

    def finish(self) -> None:
        """Write every sliding window's new slot positions (after every layer has read the old), and which positions
        the recurrent layers' stashes hold (:meth:`finish_stashes`)."""
        for key, plan in self._memo.items():
            if key[0] == "window":
                self.decoder.window_positions(key[1]).copy_(plan.positions)
        self.finish_stashes()

    def finish_stashes(self) -> None:
        """The positions (plus one) whose states the recurrent layers' stashes now hold: a verify call's, or none
        after any other call (its state goes on from its own last position)."""
        stashed = getattr(self.decoder, "stash_positions_state", None)
        if stashed is None:
            return
        if self.verifying:
            stashed.copy_(self.positions.to(stashed.dtype) + 1.0)
        else:
            stashed.copy_(torch.zeros_like(stashed))


def _int8_write(cache: torch.Tensor, scales: torch.Tensor, rows: torch.Tensor, write: Callable) -> torch.Tensor:
    """``rows`` [B, H, T, D] quantized and written into the int8 ``cache`` and its ``scales`` by ``write(cache, rows)``
    (in the scales' dtype: the int8 values are exact there); the cache after, dequantized."""
    values, scale = quantize_rows(rows.to(scales.dtype))
    stored = write(cache.to(scales.dtype), values)
    written = write(scales, scale)
    cache.copy_(stored.to(torch.int8))
    scales.copy_(written)
    return stored * written
