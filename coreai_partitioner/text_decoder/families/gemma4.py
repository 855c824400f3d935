"""Gemma 4 (text): Gemma 3's sandwich layers with plain-weight norms, per-layer inputs and shared KV.

Differences from Gemma 3 that this adapter follows (transformers 5.24):

- norms scale by ``weight`` (not ``1 + weight``), in fp32; ``v_norm`` has no
  weight; queries are not scaled (``scaling = 1``), q and k are normed per head;
- full-attention layers have their own head size and KV heads
  (``config.per_layer_config``), RoPE ``proportional`` (frequencies past the
  rotated fraction are zero, so the ``rope`` composite rotates every pair and
  the rest pass through), and with ``attention_k_eq_v`` their values are the
  key projection, before its norm and RoPE;
- the last ``num_kv_shared_layers`` layers attend the keys and values of the
  last earlier layer of their type (``config.kv_sharing_modes``);
- per-layer inputs: each token's ``embed_tokens_per_layer`` row plus a
  projection of its embedding, one ``hidden_size_per_layer_input`` slice per
  layer, gated into the residual after the MLP; each layer's output is then
  multiplied by its ``layer_scalar``.

Composites: every RMSNorm with a weight or without, every attention, RoPE
on q and k.  The MoE block (``enable_moe_block``) is not adapted yet.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coreai_partitioner.blocks import Attention, AttentionShape, activation
from coreai_partitioner.text_decoder.families._tiny import tiny

MODEL_TYPES = ("gemma4_text",)


class PerLayerInputs(nn.Module):
    """``(tokens, embeddings, step)``: each layer's per-layer input, left in ``step.left["per_layer"]`` ``[B, T, L, P]``."""

    def __init__(self, base: nn.Module, norm: nn.Module, layers: int, width: int) -> None:
        super().__init__()
        self.table = base.embed_tokens_per_layer  # scales by sqrt(width) itself
        self.projection = base.per_layer_model_projection
        self.norm = norm
        self.projection_scale = float(base.per_layer_model_projection_scale)
        self.input_scale = float(base.per_layer_input_scale)
        self.layers, self.width = layers, width

    def forward(self, tokens: torch.Tensor, embeddings: torch.Tensor, step) -> None:
        shape = (*tokens.shape, self.layers, self.width)
        identity = self.table(tokens).reshape(shape)
        context = self.norm((self.projection(embeddings) * self.projection_scale).reshape(shape))
        step.left["per_layer"] = (context + identity) * self.input_scale


class Layer(nn.Module):
    """A Gemma 4 layer: the sandwich block, then the per-layer input gate, then ``layer_scalar``."""

    def __init__(self, block: nn.Module, index: int, layer: nn.Module, norm: nn.Module | None, act) -> None:
        super().__init__()
        self.block = block
        self.index = index
        self.gate = getattr(layer, "per_layer_input_gate", None)
        self.projection = getattr(layer, "per_layer_projection", None)
        self.norm = norm
        self.act = act
        self.register_buffer("layer_scalar", layer.layer_scalar.detach().clone(), persistent=False)

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        x = self.block(x, step)
        if self.gate is not None:
            gated = self.act(self.gate(x)) * step.left["per_layer"][:, :, self.index, :]
            x = x + self.norm(self.projection(gated))
        return x * self.layer_scalar


class Gemma4Attention(Attention):
    """Gemma 4's attention: values normed per head by ``v_norm`` (no weight); on a full layer without
    ``v_proj`` (``attention_k_eq_v``) the values are the key projection, before its norm and RoPE.  A layer
    that ``store``\ s leaves the keys, values and mask it attended in the step, under its path, for the
    layers that share them (:class:`SharedKVAttention`).
    """

    def __init__(self, *args, v_norm: nn.Module | None, store: bool, **options) -> None:
        super().__init__(*args, **options)
        self.v_norm = v_norm
        self.store = store

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k = self.k(x)
        return self.q(x), k, k if self.v is None else self.v(x)

    def value_heads(self, v: torch.Tensor) -> torch.Tensor:
        return self.heads(v, self.v_norm)

    def cache(self, k: torch.Tensor, v: torch.Tensor, step) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attended = super().cache(k, v, step)
        if self.store:
            step.left[("kv", self.path)] = attended
        return attended


class SharedKVAttention(Attention):
    """One of Gemma 4's last ``num_kv_shared_layers`` layers: no cache and no k/v projections of its own; its
    queries attend the keys, values and mask the layer at ``producer`` left in the step."""

    owns_cache = False
    borrows_keys = True

    def __init__(self, *args, producer: str, **options) -> None:
        super().__init__(*args, **options)
        self.producer = producer

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        return self.o(self.attend_heads(self.q(x), None, None, step))

    def keys_values(self, k: None, v: None, step) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return step.left[("kv", self.producer)]


def build(build):
    config = build.config
    base = build.base
    if getattr(config, "enable_moe_block", False):
        raise build.refuse("enable_moe_block", True, "False (Gemma 4's MoE block is not adapted yet)")
    ropes = build.layer_ropes()  # a table per layer type
    types = build.layer_types()
    modes = config.kv_sharing_modes
    act = activation(config.hidden_activation, "hidden_activation")
    producers: dict[str, str] = {}
    layers = []
    for i, layer in enumerate(base.layers):
        attn = layer.self_attn
        path = f"model.layers.{i}.self_attn"
        reuse = modes[i] == "reuse"
        if modes[i] == "store":
            producers[types[i]] = path
        heads = AttentionShape(config.num_attention_heads, config.per_layer_config[i].num_key_value_heads, attn.head_dim)
        q_norm = build.norm(attn.q_norm, fp32_scale=True)
        if reuse:
            attention = build.attention(
                i, shape=heads, rope=ropes[i], q_norm=q_norm, kind=SharedKVAttention, producer=producers[types[i]]
            )
        else:
            attention = build.attention(
                i,
                shape=heads,
                rope=ropes[i],
                q_norm=q_norm,
                k_norm=build.norm(attn.k_norm, fp32_scale=True),
                kind=Gemma4Attention,
                v_norm=build.norm(attn.v_norm, fp32_scale=True),
                store=modes[i] == "store",
            )
        block = build.block(
            attention,
            build.mlp(layer.mlp),
            pre_attn=build.norm(layer.input_layernorm, fp32_scale=True),
            post_attn=build.norm(layer.post_attention_layernorm, fp32_scale=True),
            pre_mlp=build.norm(layer.pre_feedforward_layernorm, fp32_scale=True),
            post_mlp=build.norm(layer.post_feedforward_layernorm, fp32_scale=True),
        )
        norm = build.norm(getattr(layer, "post_per_layer_input_norm", None), fp32_scale=True)
        layers.append(Layer(block, i, layer, norm, act))
    prepare = None
    if config.hidden_size_per_layer_input:
        norm = build.norm(base.per_layer_projection_norm, fp32_scale=True)
        prepare = PerLayerInputs(base, norm, config.num_hidden_layers, config.hidden_size_per_layer_input)
    return build.decoder(
        layers,
        norm=build.norm(base.norm, fp32_scale=True),
        final_softcap=getattr(config, "final_logit_softcapping", None),
        prepare=prepare,
    )


def first_layers(text: Any, total: int, layers: int) -> None:
    """``--num-layers``: the shared-KV layers are the last ones, and those cut off are shared no more."""
    text.num_kv_shared_layers = max(0, text.num_kv_shared_layers - (total - layers))


def tiny_config(model_type: str) -> Any:
    return tiny(
        "Gemma4TextConfig",
        tie_word_embeddings=None,  # tied by default
        head_dim=16,
        num_hidden_layers=6,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 3,
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=256,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        final_logit_softcapping=3.0,
    )
