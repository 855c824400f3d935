"""Hugging Face decoder-only LLMs (Llama, Qwen2, Qwen3, Mistral) with Core AI composites.

Their ``RMSNorm`` modules cannot be externalized as they are (their ``forward``
has no type annotations), attention goes through a function rather than a
module, and RoPE is applied by a module-level function.  :func:`coreai_composites`
swaps all three for ``coreai_torch.composite_ops`` modules, in place and
reversibly::

    with hf.coreai_composites(model) as swaps:
        ep, records = externalize_modules(hf.PrefillProgram(model), default_specs(), export_fn=...)
    print(swaps)            # what was swapped; the model is the original again here

:func:`lower_decoder` makes the program an on-device LLM ships, in the form
ExecuTorch's LLM runner (``extension/llm/runner``) reads: one ``forward(tokens
[1, T], input_pos [T]) -> logits`` over a static KV cache held as Core AI
delegate state, ``T`` from 1 to a prefill chunk (a whole prompt in one call,
or one token), embedding, decoder and lm_head in one delegate, and the
runner's metadata methods (:func:`runner_metadata`).  :class:`DecoderShapes`
picks dynamic ``T`` or enumerated ``T`` in {1, chunk}.  :class:`PrefillProgram`
is the cache-free forward over a prompt, for checking composites alone.
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

from . import _compat

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
    AttentionMaskInterface.register(ATTENTION, _mask_for(sdpa_mask_without_vmap))


def _mask_for(fallback: Callable[..., Any]) -> Callable[..., Any]:
    """The boolean attention mask ``[B, 1, T, kv_length]`` from cache positions, built inside the delegate.

    HF's export mask (``sdpa_mask_without_vmap``, the ``fallback``) adds an int
    scalar offset and multiplies boolean masks; ExecuTorch lifts the scalar to
    a rank-0 int64 constant that stays outside the delegate, and Core AI has
    no boolean multiply.  This builds the same causal (and sliding-window)
    mask from comparisons alone, and is never ``None`` (a static cache needs
    the mask even for one query).  Padding masks and chunked attention go to
    ``fallback``.
    """

    def mask(batch_size, cache_position, kv_length, kv_offset=0, mask_function=None, attention_mask=None, **kwargs):
        config = kwargs.get("config")
        if attention_mask is not None or kv_offset != 0 or getattr(config, "attention_chunk_size", None):
            return fallback(batch_size, cache_position, kv_length, kv_offset, mask_function, attention_mask, **kwargs)
        slots = torch.arange(kv_length, dtype=cache_position.dtype, device=cache_position.device)
        positions = cache_position.view(-1, 1)
        allowed = slots <= positions
        window = getattr(config, "sliding_window", None)
        if window is not None and window < kv_length:
            distance = (positions - slots).to(torch.float32)
            allowed = torch.logical_and(allowed, distance < float(window))
        return allowed[None, None, :, :].expand(batch_size, -1, -1, -1)

    return mask


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
    previous = _compat.swap_attn_implementation(config, ATTENTION)
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
            self.plan = None  # (position, one-hot plan) of the current call, shared by every layer

        def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
            owner = self._owner[0]
            position = cache_kwargs["cache_position"]
            keys = getattr(owner, f"key_cache_{layer_idx}")
            values = getattr(owner, f"value_cache_{layer_idx}")
            if self.plan is None or self.plan[0] is not position:
                self.plan = (position, _write_plan(position, keys.shape, keys.dtype))
            keys.copy_(_write_at(keys, key_states, position, self.plan[1]))
            values.copy_(_write_at(values, value_states, position, self.plan[1]))
            return keys, values

    return BufferStaticCache


def _write_at(cache: torch.Tensor, states: torch.Tensor, position: torch.Tensor, plan=None) -> torch.Tensor:
    """``cache`` with ``states`` [B, H, T, D] written at sequence ``position`` [T], as a one-hot product.

    ``index_copy`` decomposes to ``index_put``, which coreai-torch converts only
    when the indexed dimension is static; a product with a one-hot matrix is
    exact (one nonzero term per row), converts with ``T`` symbolic, and keeps
    the whole write inside the delegate.  Positions outside the cache write nothing.
    ``plan`` is :func:`_write_plan`'s for ``position`` and this cache's shape,
    when several caches share it.  The product is one ``bmm`` over ``B * H``:
    ``matmul`` on these shapes decomposes into copies and reshapes over ``T``,
    2.5x the tracing time.
    """
    batch, heads, length, dim = cache.shape
    spread, kept = plan if plan is not None else _write_plan(position, cache.shape, cache.dtype)
    rows = states.to(cache.dtype).reshape(batch * heads, states.shape[2], dim)
    written = torch.bmm(spread, rows).view(batch, heads, length, dim)
    return cache * kept + written


def _write_plan(position: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """For a cache of ``shape`` [B, H, L, D]: the one-hot of ``position`` [T] as ``[B * H, L, T]``, and
    ``[L, 1]``, 0 where written and 1 elsewhere."""
    batch, heads, length, _ = shape
    slots = torch.arange(length, dtype=position.dtype, device=position.device)
    one_hot = (position.unsqueeze(-1) == slots).to(dtype)  # [T, L]
    kept = 1.0 - one_hot.sum(0).unsqueeze(-1)  # a float scalar, not a lifted int64
    # Batched by a broadcasting product, not an expand: Core AI (coreai-core 1.0.0b3) folds an expand
    # to a shape read at run time wrongly when an enumerated T is 1 (see remove_noop_expands).
    spread = one_hot.transpose(0, 1) * torch.ones(batch * heads, 1, 1, dtype=dtype, device=position.device)
    return spread, kept


class StaticCacheDecoder(nn.Module):
    """A decoder step over a static KV cache: ``(tokens [1, T], input_pos [T]) -> logits [1, T, vocab]``.

    ``input_pos`` holds the cache positions of the ``T`` tokens (ExecuTorch's
    ``TextDecoderRunner`` feeds this form when the method's second input has
    more than one element).  ``T`` tokens at once is a prefill, one token a
    decode step; both write the cache.  The cache is ``key_cache_<layer>`` /
    ``value_cache_<layer>`` buffers of ``max_cache_len`` positions, updated in
    place; lowered with ``take_over_mutable_buffer=True`` (the default) they
    are the delegate's state.
    """

    def __init__(self, model: nn.Module, max_cache_len: int, batch_size: int = 1) -> None:
        super().__init__()
        self.model = model
        self.max_cache_len = max_cache_len
        config = model.config.get_text_config()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", config.num_attention_heads)
        self.cache = _static_cache_class()(self, max_cache_len=max_cache_len, config=config)
        self.cache.early_initialization(batch_size, kv_heads, head_dim, model.dtype, "cpu")
        shape = (batch_size, kv_heads, max_cache_len, head_dim)
        for layer in range(config.num_hidden_layers):
            self.register_buffer(f"key_cache_{layer}", torch.zeros(shape, dtype=model.dtype), persistent=False)
            self.register_buffer(f"value_cache_{layer}", torch.zeros(shape, dtype=model.dtype), persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        try:
            return self.model(
                input_ids=tokens, cache_position=input_pos, past_key_values=self.cache, use_cache=True
            ).logits
        finally:
            self.cache.plan = None  # one write plan per call (every layer writes the same positions)


# ---------------------------------------------------------------- one .pte for ExecuTorch's LLM runner

#: Shape modes of the exported ``forward``: ``T`` any of 1..chunk, or only 1 and chunk.
SHAPE_MODES = ("dynamic", "enumerated")


@dataclass(frozen=True)
class DecoderShapes:
    """The limits a lowered decoder was built for.

    ``max_context_len`` is the KV cache length (prompt plus generated tokens);
    ``prefill_chunk`` the most tokens one ``forward`` call takes.  ``mode``
    ``"dynamic"`` exports ``T`` as a dimension from 1 to ``prefill_chunk``
    (GPU and CPU targets, and any prompt length in one call); ``"enumerated"``
    compiles one Core AI asset with an entrypoint for ``T = 1`` and one for
    ``T = prefill_chunk`` sharing the weights (static shapes, what the Neural
    Engine needs; a shorter prompt is padded to the chunk).
    """

    max_context_len: int = 128
    prefill_chunk: int = 32
    mode: str = "dynamic"

    def __post_init__(self) -> None:
        if self.mode not in SHAPE_MODES:
            raise ValueError(f"shape mode {self.mode!r}: choose one of {', '.join(SHAPE_MODES)}")
        if not 1 <= self.prefill_chunk <= self.max_context_len:
            raise ValueError(
                f"prefill_chunk {self.prefill_chunk} must be between 1 and max_context_len "
                f"{self.max_context_len}"
            )
        if self.mode == "enumerated" and self.prefill_chunk == 1:
            raise ValueError("enumerated shapes need prefill_chunk > 1 (T = 1 and T = prefill_chunk)")

    def input_enumerations(self) -> list[dict[int, list[int]]] | None:
        """``CoreAIPartitioner(input_enumerations=...)`` for this mode: T of tokens and input_pos."""
        if self.mode != "enumerated":
            return None
        values = [1, self.prefill_chunk]
        return [{1: values}, {0: values}]


def export_decoder(
    model: nn.Module,
    shapes: DecoderShapes,
    *,
    before_export: Callable[[], None] | None = None,
    quantize: str | None = None,
    decompositions: dict | None = None,
):
    """Externalize ``model``'s composites and export its :class:`StaticCacheDecoder` with ``T`` symbolic.

    Returns ``(exported_program, records)`` as :func:`externalize_modules` does,
    their no-op ``expand`` calls removed (:func:`~coreai_partitioner.passes.remove_noop_expands`;
    enumerated ``T = 1`` needs it).  ``before_export`` runs after the composite swaps, right before
    ``torch.export``.  ``quantize`` (``"int8"`` or ``"int4"``) quantizes the weights outside the
    composites with coreai-opt (:func:`coreai_partitioner.quantize.quantize`), stored compressed.

    With ``decompositions`` (and no ``quantize``, which needs ``torch.export``'s
    own IR) the decoder is traced straight to functional ATen IR with that
    table (:func:`~coreai_partitioner._compat.export_decomposed`: one trace
    where export then ``run_decompositions`` make two).  The composites'
    sub-exports are decomposed with coreai-torch's table, as before.
    """
    from . import default_specs, externalize_modules
    from .passes import remove_noop_expands

    length = min(2, shapes.prefill_chunk)
    sample = (torch.zeros(1, length, dtype=torch.long), torch.arange(length))
    dynamic_shapes = None
    if shapes.prefill_chunk > 1:
        tokens_dim = torch.export.Dim("T", min=1, max=shapes.prefill_chunk)
        dynamic_shapes = ({1: tokens_dim}, {0: tokens_dim})

    def export_fn(module: nn.Module) -> torch.export.ExportedProgram:
        if before_export is not None:
            before_export()
        with torch.no_grad():
            if decompositions is not None and not quantize:
                return _compat.export_decomposed(module, sample, dynamic_shapes, decompositions)
            return torch.export.export(module, sample, dynamic_shapes=dynamic_shapes)

    with coreai_composites(model) as swaps:
        logger.info("swapped for Core AI composites: %s", swaps)
        decoder = StaticCacheDecoder(model, shapes.max_context_len).eval()
        program, records = externalize_modules(decoder, default_specs(), export_fn=export_fn)
    if quantize:
        from .quantize import quantize as quantize_program

        program = quantize_program(program, quantize, records=records, dynamic_shapes=dynamic_shapes)
    for graph_module in [program.graph_module, *(r.exported_program.graph_module for r in records)]:
        remove_noop_expands(graph_module)
    return program, records


def runner_metadata(model: nn.Module, shapes: DecoderShapes) -> dict[str, Any]:
    """The constant methods ExecuTorch's LLM runner reads (``extension/llm/runner/constants.h``).

    ``get_max_seq_len`` (required by the runner) is the most tokens one call
    takes, ``get_max_context_len`` the cache length.  ``enable_dynamic_shape``
    makes the runner prefill a prompt in one call; with enumerated shapes it
    feeds the prompt one token at a time instead (T = 1 is always there).
    """
    config = model.config.get_text_config()
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None) or getattr(config, "eos_token_id", None)
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    bos = getattr(generation, "bos_token_id", None) or getattr(config, "bos_token_id", None)
    return {
        "get_max_seq_len": shapes.prefill_chunk,
        "get_max_context_len": shapes.max_context_len,
        "get_vocab_size": config.vocab_size,
        "get_bos_id": bos if bos is not None else 0,
        "get_eos_ids": eos_ids,
        "use_kv_cache": True,
        "enable_dynamic_shape": shapes.mode == "dynamic",
    }


def lower_decoder(
    model: nn.Module,
    shapes: DecoderShapes,
    *,
    before_export: Callable[[], None] | None = None,
    quantize: str | None = None,
    quantized_reference: list | None = None,
    **partitioner_options: Any,
):
    """Export and lower ``model`` to one ``forward`` method in one Core AI delegate, with runner metadata.

    With ``shapes.mode == "enumerated"`` the delegate's asset has one
    statically shaped function per ``T`` (1 and the chunk) over one copy of
    the weights.  ``quantize`` is :func:`export_decoder`'s; a list passed as
    ``quantized_reference`` receives the quantized program's eager module
    (taken before lowering, which takes over the program's constants), to
    check the ``.pte`` against.  Lowers with
    :func:`~coreai_partitioner.whole_program.lower_whole_program` (the
    delegate takes the decoder whole); returns its ``EdgeProgramManager``,
    whose ``.to_executorch()`` gives the ``.pte``.
    """
    from . import CoreAIPartitioner
    from .whole_program import decomposition_table, lower_whole_program

    check_supported(model)
    program, records = export_decoder(
        model, shapes, before_export=before_export, quantize=quantize, decompositions=decomposition_table()
    )
    if quantize and quantized_reference is not None:
        quantized_reference.append(program.module())
    partitioner = CoreAIPartitioner(
        externalized_modules=records, input_enumerations=shapes.input_enumerations(), **partitioner_options
    )
    # The decoder's graph is ours and fixed, and its .pte is checked end to end by the tests: no
    # ExecuTorch IR re-verification.  Re-traces run on fake tensors without autograd bookkeeping.
    with torch.no_grad():
        return lower_whole_program(
            program,
            partitioner,
            constant_methods=runner_metadata(model, shapes),
            compile_config=_compat.unverified_compile_config(),
        )


def prefill_calls(tokens: list[int], start: int, shapes: DecoderShapes) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """The ``forward`` calls that feed ``tokens`` from cache position ``start``: ``(tokens, input_pos, used)``.

    One call per ``prefill_chunk`` tokens; with enumerated shapes a shorter
    call is padded to the chunk (``used`` says how many of its logits count).
    Raises if the tokens do not fit in the context.
    """
    if start + len(tokens) > shapes.max_context_len:
        raise ValueError(
            f"{start + len(tokens)} tokens do not fit in the context of {shapes.max_context_len} "
            "(max_context_len, the KV cache length); export with a longer context or shorten the prompt"
        )
    calls = []
    for offset in range(0, len(tokens), shapes.prefill_chunk):
        chunk = tokens[offset : offset + shapes.prefill_chunk]
        used = len(chunk)
        if shapes.mode == "enumerated" and used not in (1, shapes.prefill_chunk):
            chunk = chunk + [0] * (shapes.prefill_chunk - used)
        position = start + offset
        calls.append((torch.tensor([chunk]), torch.arange(position, position + len(chunk)), used))
    return calls


def check_call(tokens: torch.Tensor, shapes: DecoderShapes) -> None:
    """Raise, naming the limit, if ``tokens`` [1, T] is not a length the exported ``forward`` takes."""
    length = tokens.shape[-1]
    allowed = (1, shapes.prefill_chunk) if shapes.mode == "enumerated" else range(1, shapes.prefill_chunk + 1)
    if length not in allowed:
        limit = (
            f"T in {{1, {shapes.prefill_chunk}}} (enumerated shapes)"
            if shapes.mode == "enumerated"
            else f"T from 1 to the prefill chunk {shapes.prefill_chunk}"
        )
        raise ValueError(f"forward got {length} tokens; it was exported for {limit}: split or pad the call")


def greedy_decode(program: Any, prompt: list[int], new_tokens: int, shapes: DecoderShapes) -> list[int]:
    """Greedy generation through a lowered :func:`lower_decoder` program, on the Core AI runtime.

    Prefills the prompt in one ``forward`` call per ``prefill_chunk`` tokens,
    then feeds its own argmax one token at a time; returns prompt plus
    ``new_tokens`` tokens.  Starts from an empty cache.  ``program`` is what
    ``verify.run`` takes (the lowered program, its ``to_executorch()``, a ``.pte``).
    """
    from . import verify

    if not prompt:
        raise ValueError("the prompt is empty; give at least one token")
    prefill_calls(prompt + [0] * (new_tokens - 1), 0, shapes)  # raises if it cannot fit
    verify.reset_state(program)
    tokens = list(prompt)
    logits = None
    for chunk, positions, used in prefill_calls(prompt, 0, shapes):
        (logits,) = verify.run(program, chunk, positions)
        logits = logits[:, :used]
    for _ in range(new_tokens):
        tokens.append(int(logits[0, -1].argmax()))
        if len(tokens) == len(prompt) + new_tokens:
            break
        (logits,) = verify.run(program, torch.tensor([[tokens[-1]]]), torch.tensor([len(tokens) - 1]))
    return tokens


def byte_tokenizer(config: Any) -> Any:
    """A ``tokenizers.Tokenizer`` of one character per token, for the tiny configs' 256-token vocabulary.

    Token ``i`` is one printable character (ASCII as itself, the rest from
    U+0100 on), so any token sequence decodes to valid UTF-8 and ExecuTorch's
    LLM runner can print a random model's output.  ``config``'s BOS and EOS
    tokens are special tokens.
    """
    from tokenizers import Tokenizer, models

    characters = [chr(i) if 32 <= i < 127 else chr(0x100 + i) for i in range(256)]
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(characters)}, merges=[], unk_token=characters[0]))
    special = [config.bos_token_id, config.eos_token_id]
    tokenizer.add_special_tokens([characters[i] for i in special if i is not None])
    return tokenizer


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
