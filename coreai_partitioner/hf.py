"""Hugging Face decoder-only LLMs (Llama, Qwen2, Qwen3, Mistral) with Core AI composites.

Their ``RMSNorm`` modules cannot be externalized as they are (their ``forward``
has no type annotations), attention goes through a function rather than a
module, and RoPE is applied by a module-level function.  :func:`coreai_composites`
swaps all three for ``coreai_torch.composite_ops`` modules, in place and
reversibly::

    with hf.coreai_composites(model) as swaps:
        ep, records = externalize_modules(hf.PrefillProgram(model), default_specs(), export_fn=...)
    print(swaps)            # what was swapped; the model is the original again here

:class:`PrefillProgram` and :class:`StaticCacheDecoder` are the two programs
an on-device LLM needs: a forward over the prompt, and a one-token decode step
whose KV cache lives in buffers the Core AI delegate takes over as state.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from coreai_torch.composite_ops import SDPA, RMSNorm, RoPE

logger = logging.getLogger(__name__)

#: ``config.model_type`` of the architectures these transforms know.
SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")
ATTENTION = "coreai_sdpa"


@dataclass
class Swaps:
    """What :func:`coreai_composites` changed, and how to change it back."""

    rms_norms: list[str] = field(default_factory=list)
    attention: list[str] = field(default_factory=list)
    rope: list[str] = field(default_factory=list)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def restore(self) -> None:
        """Undo every swap, last first; the model computes exactly as before."""
        while self._undo:
            self._undo.pop()()

    def __str__(self) -> str:
        return (
            f"{len(self.rms_norms)} RMSNorm(s) -> rms_norm composite, "
            f"{len(self.attention)} attention(s) -> scaled_dot_product_attention composite, "
            f"RoPE -> rope composite in {len(self.rope)} module(s)"
        )


def _is_hf_rms_norm(module: nn.Module) -> bool:
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(getattr(module, "weight", None), nn.Parameter)
        and hasattr(module, "variance_epsilon")
    )


def swap_rms_norms(model: nn.Module, swaps: Swaps) -> None:
    """Replace every HF RMSNorm with ``coreai_torch.composite_ops.RMSNorm`` sharing its weight."""
    for parent_path, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if not _is_hf_rms_norm(child):
                continue
            norm = RMSNorm(child.weight.shape[-1], eps=child.variance_epsilon)
            norm.weight = child.weight
            setattr(parent, name, norm)
            swaps.rms_norms.append(f"{parent_path}.{name}" if parent_path else name)
            swaps._undo.append(lambda parent=parent, name=name, child=child: setattr(parent, name, child))


def _attention(module: nn.Module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """HF attention interface: the SDPA composite the module carries, GQA included."""
    output = module.coreai_sdpa(query, key, value, attention_mask)
    return output.transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers.integrations.executorch import sdpa_mask_without_vmap
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTENTION, _attention)
    # The mask HF builds for SDPA, without vmap, so the program exports.
    AttentionMaskInterface.register(ATTENTION, sdpa_mask_without_vmap)


def _attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [
        (path, module)
        for path, module in model.named_modules()
        if type(module).__name__.endswith("Attention") and hasattr(module, "scaling") and hasattr(module, "q_proj")
    ]


def swap_attention(model: nn.Module, swaps: Swaps) -> None:
    """Route attention through an SDPA composite on each attention module."""
    _register_attention()
    for path, module in _attention_modules(model):
        module.coreai_sdpa = SDPA(scale=module.scaling, is_causal=True)
        swaps.attention.append(path)
        swaps._undo.append(lambda module=module: delattr(module, "coreai_sdpa"))
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION
    swaps._undo.append(lambda: setattr(config, "_attn_implementation", previous))


def _rope_function(rope: RoPE) -> Callable[..., Any]:
    def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        half = cos.shape[-1] // 2
        cos, sin = cos[..., :half].unsqueeze(unsqueeze_dim), sin[..., :half].unsqueeze(unsqueeze_dim)
        return rope(q, cos, sin), rope(k, cos, sin)

    return apply_rotary_pos_emb


def swap_rope(model: nn.Module, swaps: Swaps) -> None:
    """Apply RoPE through one RoPE composite, where it computes what the model's own does.

    HF applies RoPE with ``apply_rotary_pos_emb`` from the model's modeling module;
    it is swapped only after a check on random data shows the composite (fed
    the model's own cos and sin) gives the same result.
    """
    rope = RoPE()
    replacement = _rope_function(rope)
    modules = {sys.modules[type(module).__module__] for _, module in _attention_modules(model)}
    for modeling in sorted(modules, key=lambda m: m.__name__):
        original = getattr(modeling, "apply_rotary_pos_emb", None)
        if original is None or not _same_rotation(original, replacement):
            logger.warning("%s applies RoPE differently; it keeps its own RoPE", modeling.__name__)
            continue
        modeling.apply_rotary_pos_emb = replacement
        swaps.rope.append(modeling.__name__)
        swaps._undo.append(lambda modeling=modeling, original=original: setattr(modeling, "apply_rotary_pos_emb", original))
    if swaps.rope:
        model.coreai_rope = rope
        swaps._undo.append(lambda: delattr(model, "coreai_rope"))


def _same_rotation(original: Callable[..., Any], replacement: Callable[..., Any]) -> bool:
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 5, 8, generator=generator), torch.randn(1, 1, 5, 8, generator=generator)
    angles = torch.randn(1, 5, 4, generator=generator)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    with torch.no_grad():
        expected, got = original(q, k, cos, sin), replacement(q, k, cos, sin)
    return all(torch.allclose(e, g, atol=1e-6) for e, g in zip(expected, got))


def check_supported(model: nn.Module) -> None:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED:
        raise ValueError(
            f"coreai_composites knows Hugging Face {', '.join(SUPPORTED)} models; this is "
            f"{type(model).__name__} (model_type {model_type!r}). Externalize its modules with "
            "your own ExternalizeSpec(...) instead."
        )


@contextlib.contextmanager
def coreai_composites(
    model: nn.Module, *, rms_norm: bool = True, attention: bool = True, rope: bool = True
) -> Iterator[Swaps]:
    """Swap ``model``'s RMSNorms, attention and RoPE for Core AI composites while inside.

    In place and reversible: on exit (also on an error) the model is its
    original self again.  The swapped model computes the same function.
    """
    check_supported(model)
    swaps = Swaps()
    try:
        if rms_norm:
            swap_rms_norms(model, swaps)
        if attention:
            swap_attention(model, swaps)
        if rope:
            swap_rope(model, swaps)
        logger.info("swapped for Core AI composites: %s", swaps)
        yield swaps
    finally:
        swaps.restore()


class PrefillProgram(nn.Module):
    """The forward over a prompt, without a cache: ``input_ids -> logits``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def _static_cache_class() -> type:
    from transformers import StaticCache

    class BufferStaticCache(StaticCache):
        """HF's static cache, writing into the owning module's registered buffers.

        HF's own export recipe keeps the cache tensors on the cache object, which
        torch.export (2.13) then sees as constants rather than as buffers it
        mutates; reading them off the module at every update makes each write a
        buffer mutation the delegate can own as state.
        """

        def __init__(self, owner: nn.Module, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._owner = [owner]  # a list, so the module is not registered as a child

        def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
            owner = self._owner[0]
            position = cache_kwargs["cache_position"]
            keys = getattr(owner, f"key_cache_{layer_idx}")
            values = getattr(owner, f"value_cache_{layer_idx}")
            keys.index_copy_(2, position, key_states.to(keys.dtype))
            values.index_copy_(2, position, value_states.to(values.dtype))
            return keys, values

    return BufferStaticCache


class StaticCacheDecoder(nn.Module):
    """One decode step over a static KV cache: ``(input_ids, cache_position) -> logits``.

    The cache is ``key_cache_<layer>``/``value_cache_<layer>`` buffers of
    ``max_cache_len`` positions, updated in place; lowered with
    ``take_over_mutable_buffer=True`` (the default) they are the delegate's state.
    """

    def __init__(self, model: nn.Module, max_cache_len: int, batch_size: int = 1) -> None:
        super().__init__()
        self.model = model
        config = model.config.get_text_config()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", config.num_attention_heads)
        self.cache = _static_cache_class()(self, max_cache_len=max_cache_len, config=config)
        self.cache.early_initialization(batch_size, kv_heads, head_dim, model.dtype, "cpu")
        shape = (batch_size, kv_heads, max_cache_len, head_dim)
        for layer in range(config.num_hidden_layers):
            self.register_buffer(f"key_cache_{layer}", torch.zeros(shape, dtype=model.dtype), persistent=False)
            self.register_buffer(f"value_cache_{layer}", torch.zeros(shape, dtype=model.dtype), persistent=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        return self.model(
            input_ids=input_ids, cache_position=cache_position, past_key_values=self.cache, use_cache=True
        ).logits


def greedy_decode(program: Any, prompt: list[int], new_tokens: int, *, method: str = "decode") -> list[int]:
    """Greedy generation through a lowered :class:`StaticCacheDecoder`, on the Core AI runtime.

    Feeds the prompt one token at a time, then its own argmax; returns prompt
    plus ``new_tokens`` tokens.  Starts from an empty cache.
    """
    from . import verify

    verify.reset_state(program)
    tokens = list(prompt)
    for position in range(len(prompt) + new_tokens - 1):
        (logits,) = verify.run(
            program, torch.tensor([[tokens[position]]]), torch.tensor([position]), method=method
        )
        if position >= len(prompt) - 1:
            tokens.append(int(logits[0, -1].argmax()))
    return tokens


def tiny_config(kind: str) -> Any:
    """A 2-layer config of ``kind`` (llama, qwen2, qwen3, mistral) with GQA, for tests and examples."""
    import transformers

    common = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "qwen2":
        return transformers.Qwen2Config(**common)
    if kind == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=16)
    if kind == "mistral":
        return transformers.MistralConfig(**common)
    raise ValueError(f"no tiny config named {kind!r}; choose llama, qwen2, qwen3 or mistral")
