"""Cache arithmetic: writing a call's keys and values into a full cache or a sliding ring, as products.

``index_copy`` decomposes to ``index_put``, which coreai-torch converts only
when the indexed dimension is static; a product with a one-hot matrix is
exact (one nonzero term per row), converts with ``T`` symbolic and keeps the
write inside the delegate.  :func:`write_plan` and :func:`write_at` write a
full cache (a slot per position); :func:`window_plan` and :func:`ring_write`
a sliding window's ring (slot ``p % window``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class WindowPlan:
    """A sliding window's share of one call: the attended keys' positions, the mask, the ring write."""

    mask: torch.Tensor  # [1, 1, T, ring + T] bool
    one_hot: torch.Tensor  # [T, ring]: token t goes to slot s
    kept: torch.Tensor  # [ring, 1]: 1 where a slot keeps its content
    positions: torch.Tensor  # [ring]: the ring's slot positions (plus one) after the call
    held: torch.Tensor  # [ring] bool: the slots holding a position of this sequence before the call


def written_only(cache: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """``cache`` [B, H, L, D] with every slot ``held`` [L] (bool) does not mark as written replaced by zeros.

    A slot no call has written holds whatever the memory held, NaN or Inf
    included: the SDPA composite masks a slot by adding a large negative
    number to its score and then weights its value, and ``0 * NaN`` is NaN.
    A selection, not a product, keeps such a slot out of the result.
    """
    return torch.where(held.view(1, 1, -1, 1), cache, torch.zeros((), dtype=cache.dtype, device=cache.device))


def write_plan(position: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """For a cache of ``shape`` [B, H, L, D]: the one-hot of ``position`` [T] as ``[B * H, L, T]``, and
    ``[L, 1]``, 0 where written and 1 elsewhere.

    ``index_copy`` decomposes to ``index_put``, which coreai-torch converts only
    when the indexed dimension is static; a product with a one-hot matrix is
    exact (one nonzero term per row), converts with ``T`` symbolic and keeps the
    write inside the delegate.  Positions outside the cache write nothing.
    """
    batch, heads, length, _ = shape
    slots = torch.arange(length, dtype=position.dtype, device=position.device)
    one_hot = (position.unsqueeze(-1) == slots).to(dtype)  # [T, L]
    kept = 1.0 - one_hot.sum(0).unsqueeze(-1)  # a float scalar, not a lifted int64
    return _spread(one_hot, batch * heads), kept


def _spread(one_hot: torch.Tensor, batch: int) -> torch.Tensor:
    """``one_hot`` [T, L] as ``[batch, L, T]``, the left operand of :func:`write_at`'s ``bmm``.

    Batched by a broadcasting product, not an expand: Core AI (coreai-core 1.0.0b3) folds an expand
    to a shape read at run time wrongly when an enumerated T is 1 (see lowering.passes.remove_noop_expands).
    """
    return one_hot.transpose(0, 1) * torch.ones(batch, 1, 1, dtype=one_hot.dtype, device=one_hot.device)


def write_at(cache: torch.Tensor, states: torch.Tensor, plan: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``cache`` [B, H, L, D] with ``states`` [B, H, T, D] written by ``plan`` (:func:`write_plan`'s).

    The product is one ``bmm`` over ``B * H``: ``matmul`` on these shapes
    decomposes into copies and reshapes over ``T``, 2.5x the tracing time.
    """
    batch, heads, length, dim = cache.shape
    spread, kept = plan
    rows = states.to(cache.dtype).reshape(batch * heads, states.shape[2], dim)
    written = torch.bmm(spread, rows).view(batch, heads, length, dim)
    return cache * kept + written


def ring_slot(position: torch.Tensor, size: int) -> torch.Tensor:
    """The slot of a ring of ``size`` slots that position ``position`` (float) goes to: ``p % size``, computed in
    float (exact for any position below 2**24; a float ``remainder`` is not a Core AI op)."""
    return position - torch.floor(position / float(size)) * float(size)


def ring_positions_before(first: torch.Tensor, size: int) -> torch.Tensor:
    """The positions (plus one; 0 for an empty slot) a ring of ``size`` slots holds before a call at ``first``,
    when every position before it was written in order, each in its :func:`ring_slot`.

    Slot ``s`` then holds ``first - 1 - ((first - 1 - s) mod size)`` when that is not negative: the state a
    host ring keeps (:func:`window_plan`'s ``positions``), derived instead of stored.
    """
    slots = torch.arange(size, dtype=first.dtype, device=first.device)
    held = first - 1.0 - ring_slot(first - 1.0 - slots, size)
    return torch.where(held >= 0.0, held + 1.0, torch.zeros_like(held))


def window_plan(slot_positions: torch.Tensor, position: torch.Tensor, size: int, context: int) -> WindowPlan:
    """A sliding window of ``size`` positions over a ring of ``R = len(slot_positions)`` slots (``R >= size``)
    holding the last ``R`` positions before this call, and this call's ``position``.

    ``slot_positions`` holds each slot's position plus one, 0 for an empty slot,
    so the ring's state starts at zero like any cache.  Keys attended: the
    ring's, then the call's own (``[R + T]``).  A query at ``q`` attends a
    key at ``p`` when ``q - size < p <= q`` (HF's sliding window); a ring slot
    at or past the call's first position is left from an earlier sequence (a
    new prompt at position 0) or from a verify call's rejected drafts, and is
    never attended.  The ring then keeps the call's last ``R`` real tokens,
    token ``p`` in slot ``p % R``: the mod is computed in float, exact for any
    position below 2**24.  The ``R - size`` spare slots keep, after a verify
    call of up to ``R - size + 1`` tokens, every position a call after any
    number of accepted drafts attends.
    """
    slots_held = slot_positions.shape[0]
    ring = slot_positions - 1.0
    ring = torch.where(ring < position.min(), ring, torch.full_like(ring, -1.0))
    keys = torch.cat([ring, position])
    query = position.unsqueeze(-1)
    mask = (keys >= 0.0) & (keys <= query) & (query - keys < float(size))
    real = position < float(context)
    last = torch.where(real, position, torch.full_like(position, -1.0)).max()
    written = real & (position > last - float(slots_held))
    slots = torch.arange(slots_held, dtype=position.dtype, device=position.device)
    one_hot = ((ring_slot(position, slots_held).unsqueeze(-1) == slots) & written.unsqueeze(-1)).to(position.dtype)  # [T, R]
    kept = 1.0 - one_hot.sum(0)
    updated = slot_positions * kept + (one_hot * (position + 1.0).unsqueeze(-1)).sum(0)
    return WindowPlan(mask[None, None], one_hot, kept.unsqueeze(-1), updated, ring >= 0.0)


def ring_write(cache: torch.Tensor, states: torch.Tensor, plan: WindowPlan) -> torch.Tensor:
    """``cache`` [B, H, size, D] with this call's ``states`` [B, H, T, D] written by ``plan`` (:func:`write_at`)."""
    batch, heads = cache.shape[:2]
    return write_at(cache, states, (_spread(plan.one_hot.to(cache.dtype), batch * heads), plan.kept.to(cache.dtype)))
