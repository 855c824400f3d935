"""A Hugging Face model as its family's :class:`~.decoder.Decoder` (:func:`adapt`), and what a family builds it with.

A family (a file in :mod:`.families`) reads the Hugging Face model's config
and modules and composes :mod:`coreai_partitioner.blocks` over them.  :class:`Build` gives it
the pieces most families share (RoPE tables from the model's own rotary
embedding, Llama-style attention and MLP, which layers slide) and the one way
to refuse a config value it cannot honour (:meth:`Build.refuse`), before any
export work.  :func:`first_layers` cuts a config to its first layers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from coreai_partitioner import blocks
from coreai_partitioner.blocks import Attention, AttentionShape, GatedMLP, Recurrent, RopeTable
from coreai_partitioner.blocks.errors import UnsupportedConfig
from coreai_partitioner.text_decoder.decoder import Decoder
from coreai_partitioner.text_decoder.shapes import DecoderShapes, UnsupportedShapes

logger = logging.getLogger(__name__)

#: RoPE types whose frequencies are fixed once the model is built (HF's ``ROPE_INIT_FUNCTIONS``).  Dynamic
#: NTK changes them only past ``max_position_embeddings``, which no context reaches (:func:`adapt`
#: refuses a longer one).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional", "dynamic")


@dataclass
class Build:
    """A family adapter's view of one Hugging Face causal LM, for a cache of ``context`` positions."""

    model: nn.Module
    context: int
    full_logits: bool = False
    #: Slots a sliding ring keeps beyond its window, so a verify call's rejected drafts overwrite none that a
    #: later call attends (:attr:`~.shapes.DecoderShapes.verify_tokens` less one).
    spare: int = 0
    plain: list[tuple[str, str]] = field(default_factory=list)
    #: The decoder's RoPE tables by name; ``"default"`` is the model's ``rotary_emb`` unless a family says otherwise.
    ropes: dict[str, RopeTable] = field(default_factory=dict)

    @property
    def config(self) -> Any:
        return self.model.config.get_text_config()

    @property
    def model_type(self) -> str:
        return self.config.model_type

    @property
    def base(self) -> nn.Module:
        """The decoder stack (``model.model``: embed_tokens, layers, norm, rotary_emb)."""
        return self.model.model

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def refuse(self, field_name: str, value: Any, takes: str) -> UnsupportedConfig:
        """The error for a config value this adapter cannot honour (raise it)."""
        return UnsupportedConfig(field_name, value, takes, self.model_type)

    def keep_plain(self, path: str, reason: str) -> None:
        """Record (and log) that ``path`` stays plain ops, and why."""
        self.plain.append((path, reason))
        logger.info("%s stays plain ops: %s", path, reason)

    # ------------------------------------------------------------ which layers slide

    def layer_types(self) -> list[str]:
        """``config.layer_types`` (``full_attention``, ``sliding_attention``, ...), one per layer."""
        config = self.config
        types = getattr(config, "layer_types", None)
        if types is None:
            window = getattr(config, "sliding_window", None)
            uses = getattr(config, "use_sliding_window", True)
            kind = "sliding_attention" if window is not None and uses else "full_attention"
            types = [kind] * config.num_hidden_layers
        return list(types)

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer``, or ``None`` for full attention (HF's mask: ``q - w < k <= q``)."""
        if self.layer_types()[layer] != "sliding_attention":
            return None
        window = self.config.sliding_window
        if not isinstance(window, int) or window < 1:
            raise self.refuse("sliding_window", window, "a positive number of positions")
        return window

    # ------------------------------------------------------------ RoPE

    def rope_table(self, rotary: nn.Module | None = None, *, rope_type: str | None = None, layer_type: str | None = None) -> RopeTable:
        """A :class:`RopeTable` from an HF rotary embedding module (``model.model.rotary_emb`` by default).

        Reads the module's ``original_inv_freq`` (its frequencies before any
        dynamic update) and ``attention_scaling``; ``layer_type`` picks one of a
        per-layer-type module's tables (Gemma 3: ``sliding_attention``).
        Refuses a RoPE type it does not know.
        """
        rotary = rotary if rotary is not None else self.base.rotary_emb
        prefix = f"{layer_type}_" if layer_type else ""
        kind = rope_type or _rope_type(rotary, layer_type)
        inv_freq = getattr(rotary, f"{prefix}original_inv_freq", None)
        if inv_freq is None:
            inv_freq = getattr(rotary, f"{prefix}inv_freq")
        scaling = getattr(rotary, f"{prefix}attention_scaling", getattr(rotary, "attention_scaling", 1.0))
        if kind in STATIC_ROPE_TYPES:
            return RopeTable(inv_freq, scaling)
        if kind == "longrope":
            return self._longrope_table(inv_freq, scaling)
        raise self.refuse("rope_parameters['rope_type']", kind, f"one of {', '.join((*STATIC_ROPE_TYPES, 'longrope'))}")

    def layer_ropes(self) -> list[str]:
        """The RoPE table each layer rotates with, by name: its layer type's where the model's rotary
        embedding keeps one table per layer type (Gemma 3, Gemma 4, OLMo 3 on transformers 5.24), made
        here, else ``"default"``."""
        rotary = self.base.rotary_emb
        types = self.layer_types()
        if not all(hasattr(rotary, f"{layer_type}_inv_freq") for layer_type in types):
            return ["default"] * len(types)
        for layer_type in sorted(set(types)):
            if layer_type not in self.ropes:
                self.ropes[layer_type] = self.rope_table(rotary, layer_type=layer_type)
        return types

    def _longrope_table(self, short: torch.Tensor, scaling: float) -> RopeTable:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        config = self.config
        switch = getattr(config, "original_max_position_embeddings", None) or config.rope_parameters.get(
            "original_max_position_embeddings"
        )
        long, _ = ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=switch + 1)
        return RopeTable(short, scaling, long_inv_freq=long, switch=switch, context=self.context)

    # ------------------------------------------------------------ layers

    def attention_shape(self, attn: nn.Module) -> AttentionShape:
        """Heads, KV heads and head size of ``attn``: the KV heads from its ``k_proj`` where it has one
        (a layer may have its own, Gemma 4's full layers)."""
        config = self.config
        head_dim = getattr(attn, "head_dim", None) or config.hidden_size // config.num_attention_heads
        k_proj = getattr(attn, "k_proj", None)
        if k_proj is not None:
            kv_heads = k_proj.out_features // head_dim
        else:
            kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return AttentionShape(config.num_attention_heads, kv_heads, head_dim)

    def attention(self, layer: int, attn: nn.Module | None = None, *, kind: type[Attention] = Attention, **options: Any) -> Attention:
        """Attention of class ``kind`` over layer ``layer``'s own projections (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``).

        ``attn`` is the HF attention module (``self_attn`` of the layer by
        default); ``kind`` is :class:`~.blocks.Attention` or a family's
        subclass of it, and ``options`` its keyword arguments (a family passes
        its norms, window, RoPE table, projections of other names, ...).  The
        window defaults to :meth:`window`, the scale to ``attn.scaling``, a
        partial rotation to the table's width.
        """
        attn = attn if attn is not None else self.base.layers[layer].self_attn
        shape = options.pop("shape", None) or self.attention_shape(attn)
        for name in ("q", "k", "v", "o"):
            options.setdefault(name, getattr(attn, f"{name}_proj", None))
        options.setdefault("window", self.window(layer))
        options.setdefault("scale", getattr(attn, "scaling", shape.head_dim**-0.5))
        name = options.setdefault("rope", "default")
        if name is not None and "rope_dims" not in options:
            dims = self.rope(name).dim
            options["rope_dims"] = dims if dims < shape.head_dim else None
        path = f"model.layers.{layer}.self_attn"
        options.setdefault("spare", self.spare)
        return kind(path, shape, context=self.context, dtype=self.dtype, **options)

    def mlp(self, mlp: nn.Module, act: str | None = None) -> GatedMLP:
        """The gated MLP over ``mlp``'s ``gate_proj``/``up_proj``/``down_proj``."""
        return GatedMLP(self.activation(act), gate=mlp.gate_proj, up=mlp.up_proj, down=mlp.down_proj)

    def activation(self, act: str | None = None) -> str:
        """``act``, or the config's ``hidden_act`` (``hidden_activation``, Gemma)."""
        return act or getattr(self.config, "hidden_act", None) or self.config.hidden_activation

    def moe(self, mlp: nn.Module, *, renormalize: bool, kind: type[blocks.MoE] = blocks.MoE, **options: Any) -> blocks.MoE:
        """Experts of class ``kind`` (:class:`~.blocks.MoE` or a family's subclass) over an HF sparse MoE
        block's router (``gate``) and 3-D experts (``experts``).

        ``renormalize`` is HF's ``norm_topk_prob``; ``options`` are ``kind``'s.
        """
        options.setdefault("act", getattr(self.config, "hidden_act", "silu"))
        return kind(
            router=mlp.gate.weight,
            gate_up=mlp.experts.gate_up_proj,
            down=mlp.experts.down_proj,
            top_k=mlp.gate.top_k,
            renormalize=renormalize,
            **options,
        )

    def norm(self, module: nn.Module | None, **options: bool) -> blocks.Norm | None:
        return blocks.norm(module, **options)

    def block(self, mixer: nn.Module, mlp: nn.Module, **norms: Any) -> blocks.Block:
        """One layer (:class:`~.blocks.Block`): the mixer, the MLP, the norms around them."""
        return blocks.Block(mixer, mlp, **norms)

    def pre_norm_block(
        self, layer: nn.Module, mixer: nn.Module, mlp: nn.Module | None = None, **norm: bool
    ) -> blocks.Block:
        """Llama's layer: ``input_layernorm`` before the mixer, ``post_attention_layernorm`` before the MLP.

        ``mlp`` defaults to the gated MLP over ``layer.mlp``; ``norm`` are
        :class:`~.blocks.Norm`'s options for both norms (``plus_one``, ``fp32_scale``).
        """
        return blocks.Block(
            mixer,
            mlp if mlp is not None else self.mlp(layer.mlp),
            pre_attn=self.norm(layer.input_layernorm, **norm),
            pre_mlp=self.norm(layer.post_attention_layernorm, **norm),
        )

    # ------------------------------------------------------------ the decoder

    def rope(self, name: str = "default") -> RopeTable:
        """The decoder's RoPE table ``name``; ``"default"`` is made from ``model.model.rotary_emb`` on first use."""
        if name not in self.ropes:
            if name != "default":
                raise KeyError(f"no RoPE table named {name!r}; add it to Build.ropes first")
            self.ropes[name] = self.rope_table()
        return self.ropes[name]

    def decoder(self, layers: list[nn.Module], **options: Any) -> Decoder:
        """The :class:`~.decoder.Decoder` over the model's embedding, ``layers``, final norm and lm_head."""
        base = self.base
        if "norm" not in options:
            options["norm"] = self.norm(base.norm)
        return Decoder(
            model_type=self.model_type,
            embed=base.embed_tokens,
            layers=layers,
            lm_head=self.model.lm_head,
            rope_tables=self.ropes,
            context=self.context,
            full_logits=self.full_logits,
            plain=self.plain,
            verify_len=self.spare + 1 if self.spare else 0,
            **options,
        )


def _rope_type(rotary: nn.Module, layer_type: str | None) -> str:
    kind = getattr(rotary, "rope_type", None)
    if isinstance(kind, dict):
        kind = kind.get(layer_type)
    return kind or "default"


def adapt(model: nn.Module, shapes: DecoderShapes, *, full_logits: bool = False) -> Decoder:
    """The :class:`~.decoder.Decoder` of ``model``'s family, over its own weights, for ``shapes``.

    Raises :class:`~.families.UnsupportedModel` for a model no family adapts,
    :class:`~.errors.UnsupportedConfig` for a config value its family cannot
    honour and :class:`UnsupportedShapes` for shapes it cannot take
    (recurrent layers and enumerated shapes), all before any export work.
    """
    from coreai_partitioner.text_decoder.families import family_of

    family = family_of(model)
    config = model.config.get_text_config()
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and shapes.max_context_len > limit:
        raise Build(model, shapes.max_context_len).refuse(
            "max_position_embeddings", limit, f"a context of at most {limit} positions (got max_context_len {shapes.max_context_len})"
        )
    spare = max(shapes.verify_tokens - 1, 0)
    build = Build(model, shapes.max_context_len, full_logits=full_logits, spare=spare)
    decoder = family.build(build).eval()
    recurrent = [type(m).__name__ for m in decoder.modules() if isinstance(m, Recurrent)]
    if recurrent and shapes.mode == "enumerated":
        raise UnsupportedShapes(
            f"{build.model_type}: enumerated shapes pad a short prompt in front, and its recurrent layers "
            f"({', '.join(sorted(set(recurrent)))}) would take the padding into their state; export with dynamic "
            "shapes (--shapes dynamic)"
        )
    logger.info("%s: %d layer(s) adapted by %s", build.model_type, len(decoder.layers), family.__name__.rsplit(".", 1)[-1])
    return decoder


def first_layers(config: Any, layers: int) -> Any:
    """A copy of ``config`` with only its first ``layers`` decoder layers (Apple's exporter's ``--num-layers``).

    Every per-layer list (``layer_types``, ``no_rope_layers``, ...) is cut to
    match, and a family's own per-layer fields by its ``first_layers(text_config,
    total, layers)`` (Gemma 4's shared-KV layers).  Loading a checkpoint with it
    reads only those layers' weights.
    """
    import copy

    from coreai_partitioner.text_decoder.families import registry

    config = copy.deepcopy(config)
    text = config.get_text_config()
    total = text.num_hidden_layers
    if not 1 <= layers <= total:
        raise ValueError(f"num_layers {layers}: the model has {total} layers; give 1 to {total}")
    per_layer = {name: value[:layers] for name, value in vars(text).items() if isinstance(value, list) and len(value) == total}
    text.num_hidden_layers = layers
    for name, value in per_layer.items():
        setattr(text, name, value)
    cut = getattr(registry().get(text.model_type), "first_layers", None)
    if cut is not None:
        cut(text, total, layers)
    return config
