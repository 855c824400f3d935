"""The shared blocks a family's decoder is made of, over the Hugging Face model's own weights.

Every block holds the HF model's modules and parameters themselves (never a
copy), computes what HF's eager forward computes, and calls Core AI
composites where the math is the composite's: :class:`Norm` (``rms_norm``),
:class:`Attention` (``rope`` and ``scaled_dot_product_attention``).  Where a
family's math is not a composite's (a norm over a different axis, attention
logits soft-capped), the block computes it with plain ops and the reason is
logged (:func:`plain`).

A decoder step (:class:`Step`) holds what every layer of one ``forward``
call shares: the positions, RoPE's cos and sin per table, the attention
masks and the KV cache write plans.  Caches are the attention modules'
buffers: a full cache of ``context`` slots, written then attended; a
sliding layer's cache of ``window`` slots, a ring (slot ``p % window``)
whose previous contents and the call's own keys are attended together, so a
prompt longer than the window is still one call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from coreai_torch.composite_ops import SDPA, GatedDeltaUpdate, GatherMM, RMSNormImpl, RoPE

from coreai_partitioner import _compat

logger = logging.getLogger(__name__)

def plain(path: str, reason: str) -> None:
    """Log that ``path`` stays plain ops, and why (the composite does not compute its math)."""
    logger.info("%s stays plain ops: %s", path, reason)


class Norm(nn.Module):
    """An RMSNorm through the ``rms_norm`` composite: ``x / rms(x) * scale``.

    ``scale`` is the HF module's weight; ``plus_one`` norms (Gemma, Qwen3-Next)
    scale by ``1 + weight`` computed in fp32, and ``fp32_scale`` norms (OLMo 2)
    multiply in fp32 before the cast back: both are the composite's own
    branch for an fp32 scale.  ``weight=None`` is a norm without a scale.
    """

    def __init__(self, weight: nn.Parameter | None, eps: float, *, plus_one: bool = False, fp32_scale: bool = False) -> None:
        super().__init__()
        self.weight = weight
        if weight is None:
            self.register_buffer("ones", torch.ones(()), persistent=False)
        self.plus_one = plus_one
        self.fp32_scale = fp32_scale
        self.impl = RMSNormImpl(eps=float(eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return self.impl(x, self.ones.to(x.dtype).expand(x.shape[-1]))
        scale = self.weight
        if self.plus_one:
            scale = scale.float() + 1.0
        elif self.fp32_scale:
            scale = scale.float()
        return self.impl(x, scale)


def norm_eps(module: nn.Module) -> float:
    """The epsilon of an HF norm module, whichever name it has."""
    for name in ("variance_epsilon", "eps", "epsilon"):
        value = getattr(module, name, None)
        if isinstance(value, float):
            return value
    raise ValueError(f"{type(module).__name__} has no epsilon attribute (variance_epsilon, eps)")


def norm(module: nn.Module | None, **options: bool) -> Norm | None:
    """:class:`Norm` over an HF RMSNorm module's own weight (``None`` stays ``None``)."""
    if module is None:
        return None
    return Norm(getattr(module, "weight", None), norm_eps(module), **options)


# ---------------------------------------------------------------- RoPE


class RopeTable(nn.Module):
    """RoPE's cos and sin at a call's positions, as HF's rotary embedding computes them.

    ``inv_freq`` is the model's own (every HF rope type's init function has
    run: default, linear, llama3, yarn, longrope, ...), ``scaling`` its
    ``attention_scaling``.  A longrope table also holds the long factors'
    frequencies and picks them for a call whose last position is at or past
    ``switch`` (HF's ``original_max_position_embeddings``), per call as HF does;
    padding positions (at or past ``context``) do not count.
    Returns half-width tables ``[1, 1, T, dim / 2]``, what the ``rope``
    composite takes.
    """

    def __init__(
        self,
        inv_freq: torch.Tensor,
        scaling: float = 1.0,
        *,
        long_inv_freq: torch.Tensor | None = None,
        switch: int = 0,
        context: int = 0,
    ) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.detach().float().clone(), persistent=False)
        if long_inv_freq is not None:
            self.register_buffer("long_inv_freq", long_inv_freq.detach().float().clone(), persistent=False)
        self.long = long_inv_freq is not None
        self.switch = switch
        self.context = context
        self.scaling = float(scaling)

    @property
    def dim(self) -> int:
        return 2 * self.inv_freq.shape[0]

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        position = positions.float().unsqueeze(-1)
        inv_freq = self.inv_freq
        if self.long:  # padding (positions at or past the context) does not count
            real = positions.float()
            longest = torch.where(real < float(self.context), real, torch.zeros_like(real)).max() + 1.0
            inv_freq = torch.where(longest > float(self.switch), self.long_inv_freq, self.inv_freq)
        angle = position * inv_freq
        cos, sin = angle.cos(), angle.sin()
        if self.scaling != 1.0:
            cos, sin = cos * self.scaling, sin * self.scaling
        return cos.to(dtype)[None, None], sin.to(dtype)[None, None]


# ---------------------------------------------------------------- one forward call


@dataclass
class WindowPlan:
    """A sliding window's share of one call: the attended keys' positions, the mask, the ring write."""

    mask: torch.Tensor  # [1, 1, T, window + T] bool
    one_hot: torch.Tensor  # [T, window]: token t goes to slot s
    kept: torch.Tensor  # [window, 1]: 1 where a slot keeps its content
    positions: torch.Tensor  # [window]: the ring's slot positions (plus one) after the call


class Step:
    """What every layer of one ``forward(tokens, input_pos)`` call shares; built once per call.

    Positions at or past ``context`` are padding (enumerated shapes pad a
    short prompt in front with them): they write no cache slot and no query
    of a real token attends them.
    """

    def __init__(self, decoder: nn.Module, input_pos: torch.Tensor, dtype: torch.dtype | None = None) -> None:
        self.decoder = decoder
        self.positions = input_pos
        #: The activations' dtype (RoPE's tables are made in it); the decoder sets it from its embedding.
        self.dtype = dtype
        self._memo: dict = {}

    def _memoized(self, key, make: Callable):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def rope(self, table: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self._memoized(("rope", table), lambda: self.decoder.rope_tables[table](self.positions, self.dtype))

    def carry(self, state: torch.Tensor) -> torch.Tensor:
        """``state`` where the call goes on from an earlier one, zeros where it starts at position 0.

        A recurrent layer's state is what its earlier calls left; a call at
        position 0 (a new prompt, or ExecuTorch's runner after ``reset()``)
        starts from nothing, as the KV cache's slots are written from 0 again.
        """
        goes_on = self._memoized("goes_on", lambda: self.positions[:1] > 0)
        return torch.where(goes_on, state, torch.zeros_like(state))  # not a product: 0 * NaN is NaN

    def full_mask(self, length: int) -> torch.Tensor:
        """``[1, 1, T, length]``: a query attends every cache slot at or before its position."""

        def make():
            slots = torch.arange(length, dtype=self.positions.dtype, device=self.positions.device)
            return (slots <= self.positions.view(-1, 1))[None, None]

        return self._memoized(("full_mask", length), make)

    def position_scale(self, beta: float, original: int) -> torch.Tensor:
        """``[1, 1, T, 1]``: Llama 4's query scale ``1 + beta * log(1 + floor(position / original))``."""

        def make():
            blocks = torch.floor(self.positions.float() / float(original))
            return (1.0 + beta * torch.log(1.0 + blocks)).view(1, 1, -1, 1)

        return self._memoized(("position_scale", beta, original), make)

    def store_kv(self, path: str, kv: tuple) -> None:
        self._memo[("shared", path)] = kv

    def shared_kv(self, path: str) -> tuple:
        """The keys, values and mask the layer at ``path`` attended in this call (KV sharing)."""
        return self._memo[("shared", path)]

    def write_plan(self, shape: torch.Size, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The one-hot write of this call's positions into a full cache of ``shape`` [B, H, L, D]."""
        return self._memoized(("write", tuple(shape), dtype), lambda: write_plan(self.positions, shape, dtype))

    def window(self, size: int) -> WindowPlan:
        """The plan of a sliding window of ``size`` slots (:class:`WindowPlan`), shared by its layers."""

        def make():
            slot_positions = self.decoder.window_positions(size)
            return window_plan(slot_positions, self.positions.float(), size, self.decoder.context)

        return self._memoized(("window", size), make)

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

    def finish(self) -> None:
        """Write every sliding window's new slot positions (after every layer has read the old)."""
        for key, plan in self._memo.items():
            if key[0] == "window":
                self.decoder.window_positions(key[1]).copy_(plan.positions)


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
    to a shape read at run time wrongly when an enumerated T is 1 (see llm.passes.remove_noop_expands).
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


def window_plan(slot_positions: torch.Tensor, position: torch.Tensor, size: int, context: int) -> WindowPlan:
    """A ring of ``size`` slots holding the last ``size`` positions before this call, and this call's ``position``.

    ``slot_positions`` holds each slot's position plus one, 0 for an empty slot,
    so the ring's state starts at zero like any cache.  Keys attended: the
    ring's, then the call's own (``[size + T]``).  A query at ``q`` attends a
    key at ``p`` when ``q - size < p <= q`` (HF's sliding window); a ring slot
    at or past the call's first position is left from an earlier sequence (a
    new prompt at position 0) and is never attended.  The ring
    then keeps the call's last ``size`` real tokens, token ``p`` in slot
    ``p % size``: the mod is computed in float, exact for any position below 2**24.
    """
    ring = slot_positions - 1.0
    ring = torch.where(ring < position.min(), ring, torch.full_like(ring, -1.0))
    keys = torch.cat([ring, position])
    query = position.unsqueeze(-1)
    mask = (keys >= 0.0) & (keys <= query) & (query - keys < float(size))
    real = position < float(context)
    last = torch.where(real, position, torch.full_like(position, -1.0)).max()
    written = real & (position > last - float(size))
    slot = position - torch.floor(position / float(size)) * float(size)
    slots = torch.arange(size, dtype=position.dtype, device=position.device)
    one_hot = ((slot.unsqueeze(-1) == slots) & written.unsqueeze(-1)).to(position.dtype)  # [T, size]
    kept = 1.0 - one_hot.sum(0)
    updated = slot_positions * kept + (one_hot * (position + 1.0).unsqueeze(-1)).sum(0)
    return WindowPlan(mask[None, None], one_hot, kept.unsqueeze(-1), updated)


def ring_write(cache: torch.Tensor, states: torch.Tensor, plan: WindowPlan) -> torch.Tensor:
    """``cache`` [B, H, size, D] with this call's ``states`` [B, H, T, D] written by ``plan`` (:func:`write_at`)."""
    batch, heads = cache.shape[:2]
    return write_at(cache, states, (_spread(plan.one_hot.to(cache.dtype), batch * heads), plan.kept.to(cache.dtype)))


# ---------------------------------------------------------------- attention


@dataclass(frozen=True)
class AttentionShape:
    heads: int
    kv_heads: int
    head_dim: int


class Attention(nn.Module):
    """HF attention over a static cache the module owns, through the ``rope`` and SDPA composites.

    ``q``, ``k``, ``v`` are the HF projections, or ``qkv`` one fused
    projection split in that order (Phi-3); ``v=None`` with ``v_from_k``
    takes the values from the key projection before its norm and RoPE
    (Gemma 4's full layers).  ``q_norm`` / ``k_norm`` / ``v_norm`` norm each
    head (``norm_width="head"``) or q and k over the whole projection
    (``"all"``, OLMo 2) before RoPE.  ``rope`` names the decoder's
    :class:`RopeTable` (``None``: no RoPE, SmolLM3's NoPE layers) and
    ``rope_dims`` a partial rotation.  ``window`` makes a sliding layer
    (:func:`window_plan`); ``softcap`` (Gemma 2) soft-caps the attention
    logits, which the SDPA composite has no attribute for, so that attention
    is plain ops.  ``sinks`` are GPT-OSS's per-head sink logits, the SDPA
    composite's own input.  ``output_gate`` (Qwen3-Next) splits ``q``'s
    projection per head into query and gate and multiplies the attention by
    ``sigmoid(gate)``.  ``position_scale`` is Ministral 3's ``(beta,
    original_max_position_embeddings)``: queries scaled by
    ``1 + beta * log(1 + floor(position / original))`` after RoPE.

    KV sharing (Gemma 4): a layer with ``store=True`` leaves the keys, values
    and mask it attended in the call's :class:`Step` under its ``path``; a
    layer with ``shared=<that path>`` has no cache and no k/v projections of
    its own and attends them with its own queries.
    """

    def __init__(
        self,
        path: str,
        shape: AttentionShape,
        *,
        o: nn.Module,
        context: int,
        dtype: torch.dtype,
        scale: float,
        q: nn.Module | None = None,
        k: nn.Module | None = None,
        v: nn.Module | None = None,
        qkv: nn.Module | None = None,
        v_from_k: bool = False,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        v_norm: nn.Module | None = None,
        norm_width: str = "head",
        rope: str | None = "default",
        rope_dims: int | None = None,
        window: int | None = None,
        softcap: float | None = None,
        sinks: nn.Parameter | None = None,
        output_gate: bool = False,
        position_scale: tuple[float, int] | None = None,
        store: bool = False,
        shared: str | None = None,
    ) -> None:
        super().__init__()
        self.path = path
        self.shape = shape
        self.q, self.k, self.v, self.qkv, self.o = q, k, v, qkv, o
        self.v_from_k = v_from_k
        self.q_norm, self.k_norm, self.v_norm = q_norm, k_norm, v_norm
        self.norm_width = norm_width
        self.rope_table = rope
        self.rotary = RoPE(dims=rope_dims) if rope is not None else None
        self.scale = float(scale)
        self.window = window if window is not None and window < context else None
        self.softcap = softcap
        self.sinks = sinks
        self.output_gate = output_gate
        self.position_scale = position_scale
        self.store = store
        self.shared = shared
        #: Why this attention is plain ops instead of the SDPA composite (None: it is the composite).
        self.plain_reason = None
        if softcap is None:
            self.sdpa = SDPA(scale=self.scale, is_causal=True, window_size=self.window or 0)
        else:
            self.plain_reason = f"its logits are soft-capped at {softcap}; the SDPA composite has no soft-capping"
            plain(f"{path} attention", self.plain_reason)
        if shared is None:
            cache_shape = (1, shape.kv_heads, self.window or context, shape.head_dim)
            self.register_buffer("key_cache", torch.zeros(cache_shape, dtype=dtype), persistent=False)
            self.register_buffer("value_cache", torch.zeros(cache_shape, dtype=dtype), persistent=False)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[0], t.shape[1], -1, self.shape.head_dim)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """q, k, v as ``[B, heads, T, D]`` (k and v ``None`` on a sharing layer), and the output gate."""
        h, kv, d = self.shape.heads, self.shape.kv_heads, self.shape.head_dim
        gate = k = v = None
        if self.qkv is not None:
            q, k, v = self.qkv(x).split([h * d, kv * d, kv * d], dim=-1)
        else:
            q = self.q(x)
            if self.shared is None:
                k = self.k(x)
                v = self.v(x) if self.v is not None else None
        if self.output_gate:
            q, gate = q.view(*x.shape[:-1], h, 2 * d).chunk(2, dim=-1)
            q, gate = q.reshape(*x.shape[:-1], h * d), gate.reshape(*x.shape[:-1], h * d)
        if self.norm_width == "all":
            q = self.q_norm(q) if self.q_norm is not None else q
            k = self.k_norm(k) if self.k_norm is not None and k is not None else k
        q = self._heads(q)
        if k is not None:
            k = self._heads(k)
            v = k if self.v_from_k else self._heads(v)
        if self.norm_width == "head":
            q = self.q_norm(q) if self.q_norm is not None else q
            if k is not None and self.k_norm is not None:
                k = self.k_norm(k)
        if v is not None and self.v_norm is not None:
            v = self.v_norm(v)
        transpose = lambda t: t.transpose(1, 2) if t is not None else None  # noqa: E731
        return transpose(q), transpose(k), transpose(v), gate

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        q, k, v, gate = self._project(x)
        if self.rotary is not None:
            cos, sin = step.rope(self.rope_table)
            q = self.rotary(q, cos, sin)
            k = self.rotary(k, cos, sin) if k is not None else None
        if self.position_scale is not None:
            q = q * step.position_scale(*self.position_scale).to(q.dtype)
        if self.shared is not None:
            keys, values, mask = step.shared_kv(self.shared)
        else:
            keys, values, mask = self._cached(k, v, step)
            if self.store:
                step.store_kv(self.path, (keys, values, mask))
        out = self._attend(q, keys.to(q.dtype), values.to(q.dtype), mask)
        out = out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o(out)

    def _cached(self, k: torch.Tensor, v: torch.Tensor, step: Step) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write this call's k and v to the cache; the keys, values and mask to attend (the step's way)."""
        if self.window is None:
            return step.full_cache(self.key_cache, self.value_cache, k, v)
        return step.ring_cache(self.window, self.key_cache, self.value_cache, k, v)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.softcap is None:
            if self.sinks is not None:
                return self.sdpa(q, keys, values, mask, self.sinks.to(q.dtype))
            return self.sdpa(q, keys, values, mask)
        groups = q.shape[1] // keys.shape[1]
        if groups > 1:  # by index, as the SDPA composite does: expand + reshape over a symbolic T trips torch.export
            heads = torch.arange(keys.shape[1], device=keys.device).repeat_interleave(groups)
            keys, values = keys.index_select(1, heads), values.index_select(1, heads)
        scores = torch.matmul(q, keys.transpose(2, 3)) * self.scale
        scores = torch.tanh(scores / self.softcap) * self.softcap
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(weights, values)


# ---------------------------------------------------------------- feed-forward


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": nn.functional.silu,
    "swish": nn.functional.silu,
    "gelu": nn.functional.gelu,
    "gelu_pytorch_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "relu": nn.functional.relu,
}


def activation(name: str, field: str = "hidden_act") -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation HF names ``name`` (``ACT2FN``), or a clear refusal naming ``field``."""
    if name not in ACTIVATIONS:
        raise UnsupportedConfig(field, name, f"one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``; ``gate_up`` is one fused projection, gate first (Phi-3)."""

    def __init__(self, act: str, *, down: nn.Module, gate: nn.Module | None = None, up: nn.Module | None = None, gate_up: nn.Module | None = None) -> None:
        super().__init__()
        self.gate, self.up, self.gate_up, self.down = gate, up, gate_up, down
        self.act_name = act
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate(x), self.up(x)
        return self.down(self.act(gate) * up)


#: How a router turns its logits into each token's experts and their weights (HF's routers, in order of operations).
ROUTINGS = ("softmax_topk", "softmax_topk_renorm", "topk_softmax")


class MoE(nn.Module):
    """Routed experts through the ``gather_mm`` composite: every token's top-k experts, no loop, no data-dependent shape.

    ``router`` is the HF router's weight ``[E, H]`` (and ``router_bias``);
    ``routing`` one of :data:`ROUTINGS`: softmax over the experts then top-k
    (Qwen3-MoE, OLMoE), the same with the k weights renormalized (Mixtral,
    Qwen3.5-MoE, ``norm_topk_prob``), or top-k of the logits then a softmax
    over the k (GPT-OSS).  The experts are HF's 3-D parameters, stored once:
    ``gate_up`` ``[E, 2I, H]`` (gate rows first, then up) and ``down``
    ``[E, H, I]``, or with ``transposed`` GPT-OSS's ``[E, H, 2I]`` (gate and
    up interleaved, with biases) and ``[E, I, H]``.  Each token's k experts
    are two ``gather_mm`` calls (gate-up, then down) over the expert tensors
    as stored; their outputs, weighted, are summed.  ``shared`` is a dense MLP
    every token also takes, scaled by ``sigmoid(shared_gate(x))`` when there
    is a gate (Qwen3.5-MoE, Qwen3-Next).
    """

    def __init__(
        self,
        *,
        router: nn.Parameter,
        gate_up: nn.Parameter,
        down: nn.Parameter,
        top_k: int,
        routing: str,
        act: str = "silu",
        router_bias: nn.Parameter | None = None,
        transposed: bool = False,
        gate_up_bias: nn.Parameter | None = None,
        down_bias: nn.Parameter | None = None,
        limit: float | None = None,
        alpha: float | None = None,
        shared: nn.Module | None = None,
        shared_gate: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if routing not in ROUTINGS:
            raise ValueError(f"routing {routing!r}: choose one of {', '.join(ROUTINGS)}")
        self.router, self.router_bias = router, router_bias
        self.gate_up, self.down = gate_up, down
        self.gate_up_bias, self.down_bias = gate_up_bias, down_bias
        self.top_k, self.routing, self.transposed = top_k, routing, transposed
        self.act = activation(act)
        self.limit, self.alpha = limit, alpha
        self.shared, self.shared_gate = shared, shared_gate
        self.gather_up = GatherMM(num_batch_axes=0)
        self.gather_down = GatherMM(num_batch_axes=0)
        #: ``{expert tensor name: its Form}`` once :meth:`quantize_experts` stored them compressed.
        self.forms: dict[str, Any] = {}

    def planned(self, scheme: Any, path: str) -> list[Any]:
        """The expert tensors ``scheme`` stores (:class:`~coreai_partitioner.quantize.schemes.Planned`), named under ``path``.

        Their output channels are axis 1 of ``[E, out, in]`` (GPT-OSS's
        ``[E, in, out]`` is clustered transposed).  int4 blocks are of 32 or of
        the largest common divisor of the input width.
        """
        from coreai_partitioner.quantize.schemes import Planned, scheme as scheme_of

        found = scheme_of(scheme)
        planned = []
        for name in ("gate_up", "down"):
            weight = getattr(self, name)
            shape = (weight.shape[0], weight.shape[2], weight.shape[1]) if self.transposed else tuple(weight.shape)
            form = found.linear
            if form.kind == "int" and form.size is not None:
                form = dataclasses.replace(form, size=math.gcd(shape[2], form.size))
            planned.append(Planned(f"{path}.{name}", path, shape, form, axis=1))
        return planned

    def quantize_experts(self, scheme: Any, path: str = "") -> None:
        """Store the experts compressed as ``scheme`` stores a Linear's weight (:meth:`planned`).

        Each expert tensor becomes the buffers of its
        :class:`~coreai_partitioner.quantize.weight_forms.Compressed` form, expanded in
        ``forward`` by its Core AI constexpr op (what the asset keeps
        compressed): per expert, int8/int4 with scales, or a look-up table per
        group of output channels.  The model's own float parameters are left
        as they were, and no longer read.
        """
        from coreai_partitioner.quantize.weight_forms import compress

        for entry in self.planned(scheme, path):
            name = entry.name.rpartition(".")[2]
            weight = getattr(self, name).detach()
            compressed = compress(weight.transpose(1, 2) if self.transposed else weight, entry.form, axis=1)
            if self.transposed:
                compressed = compressed.transpose(1, 2)
            for key, tensor in compressed.buffers.items():
                self.register_buffer(f"{name}_{key}", tensor)
            self.forms[name] = compressed.form
            setattr(self, name, None)

    def _experts(self, name: str) -> torch.Tensor:
        if name not in self.forms:
            return getattr(self, name)
        from coreai_partitioner.quantize.weight_forms import Compressed

        keys = ("indices", "lut") if self.forms[name].kind == "lut" else ("quantized", "scale")
        buffers = {key: getattr(self, f"{name}_{key}") for key in keys}
        op, args = Compressed(self.forms[name], buffers).call()
        return op(*args)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` [N, H] -> the weights [N, k] and int32 indices [N, k] of each token's experts."""
        logits = nn.functional.linear(x, self.router, self.router_bias)
        if self.routing == "topk_softmax":
            top, index = torch.topk(logits, self.top_k, dim=-1)
            weights = torch.softmax(top, dim=-1)
        else:
            top, index = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float32), self.top_k, dim=-1)
            if self.routing == "softmax_topk_renorm":
                top = top / top.sum(dim=-1, keepdim=True)
            weights = top.to(logits.dtype)
        return weights, index.to(torch.int32)

    def _glu(self, gate_up: torch.Tensor, dim: int) -> torch.Tensor:
        if self.limit is None:
            gate, up = gate_up.chunk(2, dim=dim)
            return self.act(gate) * up
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]  # GPT-OSS: interleaved along the last dim, clamped
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, index = self.route(flat)
        gate_up, down = self._experts("gate_up"), self._experts("down")
        # gather_mm takes each token's experts from axis 0 of the expert tensors as they are stored: no
        # transposed or reshaped copy of them.  HF's [E, out, in] multiplies a token as a column (the experts
        # gathered as the left operand); GPT-OSS's [E, in, out] a token as a row (as the right one).
        # One row per (token, expert it takes), [N * k, ...], experts gathered by the flat index: Core AI's
        # batch_matmul does not broadcast a token over its k experts, nor take the gathered [N, k, ...] view
        # (coreai-core 1.0.0b3: "Cannot broadcast shapes [N * k] and [N, k]").  Each token is repeated k
        # times by a broadcasting product, not an expand (see write_plan).
        pairs = index.reshape(-1)
        copies = torch.ones(1, self.top_k, 1, dtype=flat.dtype, device=flat.device)
        tokens = (flat.unsqueeze(1) * copies).reshape(-1, shape[-1])  # [N * k, H]
        if self.transposed:
            hidden = self.gather_up(tokens.unsqueeze(1), gate_up, rhs_indices=pairs)  # [N * k, 1, 2I]
            if self.gate_up_bias is not None:
                hidden = hidden + self.gate_up_bias.index_select(0, pairs).unsqueeze(1)
            out = self.gather_down(self._glu(hidden, -1), down, rhs_indices=pairs)  # [N * k, 1, H]
            if self.down_bias is not None:
                out = out + self.down_bias.index_select(0, pairs).unsqueeze(1)
        else:
            hidden = self.gather_up(gate_up, tokens.unsqueeze(-1), lhs_indices=pairs)  # [N * k, 2I, 1]
            out = self.gather_down(down, self._glu(hidden, -2), lhs_indices=pairs)  # [N * k, H, 1]
        out = (out.reshape(*index.shape, shape[-1]) * weights.unsqueeze(-1).to(out.dtype)).sum(dim=1)
        if self.shared is not None:
            shared = self.shared(flat)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(flat)) * shared
            out = out + shared
        return out.view(shape)


# ---------------------------------------------------------------- recurrent mixers


def causal_conv(conv: nn.Conv1d, state: torch.Tensor, x: torch.Tensor, step: Step) -> torch.Tensor:
    """A depthwise causal convolution of ``x`` [B, C, T] continuing from ``state`` [B, C, K - 1], which it advances.

    The convolution runs over ``state`` (zeros at position 0: :meth:`Step.carry`)
    and ``x`` together with no padding, so it gives exactly ``T`` outputs,
    each from its last ``K`` inputs; the state keeps the last ``K - 1``
    inputs for the next call (what HF's cache keeps, less the column it
    never reads).
    """
    window = torch.cat([step.carry(state), x.to(state.dtype)], dim=-1)
    state.copy_(window.narrow(-1, window.shape[-1] - state.shape[-1], state.shape[-1]))
    return nn.functional.conv1d(window.to(x.dtype), conv.weight, conv.bias, groups=conv.groups)


class GatedDeltaNet(nn.Module):
    """Qwen3-Next / Qwen3.5 linear attention, its recurrence through the ``gated_delta_update`` composite.

    Projections (Qwen3.5's ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``,
    ``in_proj_a``; Qwen3-Next's ``in_proj_qkvz`` and ``in_proj_ba``, grouped
    by key head, split here as HF splits them), a causal depthwise conv with
    SiLU over q, k and v (:func:`causal_conv`), ``beta = sigmoid(b)``,
    ``g = -exp(A_log) * softplus(a + dt_bias)``, key heads repeated to the
    value heads, the gated delta rule over the call's tokens from the state
    the last call left (the composite's ``initial_state``, zeros at position 0; it normalizes q
    and k and scales q), then a per-head RMSNorm gated by ``silu(z)`` and
    ``out_proj``.  ``conv_state`` and ``recurrent_state`` are buffers: the
    delegate's state.
    """

    def __init__(self, module: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module  # the HF linear-attention module: its projections, conv, A_log, dt_bias, norm
        self.grouped = hasattr(module, "in_proj_qkvz")
        self.heads = (module.num_k_heads, module.num_v_heads)
        self.dims = (module.head_k_dim, module.head_v_dim)
        self.norm = Norm(module.norm.weight, norm_eps(module.norm))
        self.update = GatedDeltaUpdate(use_qk_l2_norm=True)
        channels = module.conv1d.weight.shape[0]
        kernel = module.conv1d.weight.shape[-1]
        self.register_buffer("conv_state", torch.zeros(1, channels, kernel - 1, dtype=dtype), persistent=False)
        state = (1, module.num_v_heads, module.head_k_dim, module.head_v_dim)
        self.register_buffer("recurrent_state", torch.zeros(state, dtype=dtype), persistent=False)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(mixed [B, C, T] in q|k|v channel order, z [B, T, Hv, dv], b, a [B, T, Hv])``."""
        m, (hk, hv), (dk, dv) = self.module, self.heads, self.dims
        batch, length = x.shape[0], x.shape[1]
        if not self.grouped:
            mixed = m.in_proj_qkv(x)
            z = m.in_proj_z(x).view(batch, length, hv, dv)
            return mixed.transpose(1, 2), z, m.in_proj_b(x), m.in_proj_a(x)
        r = hv // hk
        qkvz = m.in_proj_qkvz(x).view(batch, length, hk, 2 * dk + 2 * r * dv)
        q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=3)
        b, a = torch.split(m.in_proj_ba(x).view(batch, length, hk, 2 * r), [r, r], dim=3)
        mixed = torch.cat([q.reshape(batch, length, -1), k.reshape(batch, length, -1), v.reshape(batch, length, -1)], -1)
        z = z.reshape(batch, length, hv, dv)
        return mixed.transpose(1, 2), z, b.reshape(batch, length, hv), a.reshape(batch, length, hv)

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        m, (hk, hv), (dk, dv) = self.module, self.heads, self.dims
        batch, length = x.shape[0], x.shape[1]
        mixed, z, b, a = self._project(x)
        mixed = nn.functional.silu(causal_conv(m.conv1d, self.conv_state, mixed, step)).transpose(1, 2)
        q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv], dim=-1)
        q, k, v = q.view(batch, length, hk, dk), k.view(batch, length, hk, dk), v.view(batch, length, hv, dv)
        beta = torch.sigmoid(b)
        g = -m.A_log.float().exp() * nn.functional.softplus(a.float() + m.dt_bias)
        if hv > hk:  # value head j reads key head j // (hv / hk), by index: repeat_interleave trips torch.export
            heads = torch.arange(hk, device=x.device).repeat_interleave(hv // hk)
            q, k = q.index_select(2, heads), k.index_select(2, heads)
        out, state = self.update(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), g.transpose(1, 2), beta.transpose(1, 2),
            step.carry(self.recurrent_state).to(q.dtype),
        )
        self.recurrent_state.copy_(state)
        normed = self.norm(out) * nn.functional.silu(z.float())  # out: [B, T, Hv, dv]
        return m.out_proj(normed.to(x.dtype).reshape(batch, length, hv * dv))


class ShortConv(nn.Module):
    """LFM2's short convolution: ``out_proj(C * conv(B * x))``, the causal conv continuing from ``conv_state``."""

    def __init__(self, module: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module  # HF's: in_proj, conv, out_proj
        channels, _, kernel = module.conv.weight.shape
        self.register_buffer("conv_state", torch.zeros(1, channels, kernel - 1, dtype=dtype), persistent=False)

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        m = self.module
        gate, carry, value = m.in_proj(x).transpose(-1, -2).chunk(3, dim=-2)
        out = carry * causal_conv(m.conv, self.conv_state, gate * value, step)
        return m.out_proj(out.transpose(-1, -2))


class Block(nn.Module):
    """One decoder layer: ``h = x + s * post_attn(mixer(pre_attn(x)))``, then ``h + s * post_mlp(mlp(pre_mlp(h)))``.

    Llama's ``input_layernorm`` is ``pre_attn`` and its ``post_attention_layernorm``
    ``pre_mlp``; Gemma has all four; OLMo 2 only the ``post_`` ones.  ``s`` is
    Granite's ``residual_multiplier``.  ``mixer`` is attention or a recurrent
    mixer (anything taking ``(x, step)``).
    """

    def __init__(
        self,
        mixer: nn.Module,
        mlp: nn.Module,
        *,
        pre_attn: nn.Module | None = None,
        post_attn: nn.Module | None = None,
        pre_mlp: nn.Module | None = None,
        post_mlp: nn.Module | None = None,
        residual_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.mixer, self.mlp = mixer, mlp
        self.pre_attn, self.post_attn, self.pre_mlp, self.post_mlp = pre_attn, post_attn, pre_mlp, post_mlp
        self.residual_scale = float(residual_scale)

    @staticmethod
    def _through(module: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
        return module(x) if module is not None else x

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        out = self._through(self.post_attn, self.mixer(self._through(self.pre_attn, x), step))
        h = x + out * self.residual_scale if self.residual_scale != 1.0 else x + out
        out = self._through(self.post_mlp, self.mlp(self._through(self.pre_mlp, h)))
        return h + out * self.residual_scale if self.residual_scale != 1.0 else h + out


class UnsupportedConfig(ValueError):
    """A config value a family's adapter cannot honour; names the field and what it takes."""

    def __init__(self, field: str, value: object, takes: str, model_type: str | None = None) -> None:
        where = f"{model_type}: " if model_type else ""
        super().__init__(f"{where}config.{field} = {value!r} is not supported; it takes {takes}")
        self.field = field
