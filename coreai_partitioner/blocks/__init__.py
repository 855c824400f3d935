"""The primitives a family's decoder is made of, over the Hugging Face model's own weights, a file each.

Every block holds the HF model's modules and parameters themselves (never a
copy), computes what HF's eager forward computes, and calls Core AI
composites where the math is the composite's:

- :mod:`.norm`: :class:`Norm` (``rms_norm``);
- :mod:`.rope`: :class:`RopeTable`, cos and sin at a call's positions;
- :mod:`.step`: :class:`Step`, what every layer of one call shares, and how it reads and writes a cache;
- :mod:`.cache`: writing a call's keys and values into a full cache or a sliding ring;
- :mod:`.attention`: :class:`Attention` (``rope`` and ``scaled_dot_product_attention``);
- :mod:`.mlp`: :class:`GatedMLP` and the activations;
- :mod:`.moe`: :class:`MoE` (``gather_mm``);
- :mod:`.recurrent`: :class:`GatedDeltaNet` (``gated_delta_update``) and the causal convolution;
- :mod:`.block`: :class:`Block`, one layer;
- :mod:`.encoder`: :class:`EncoderLayer`, an encoder's layer (vision towers, speech encoders): bidirectional
  :class:`EncoderAttention` without a cache (SDPA, not causal), HF's LayerNorms (``layer_norm``), an :class:`MLP`;
  :class:`PostNormEncoderLayer`, the same parts normalized after each residual sum (BERT-class text encoders);
- :mod:`.cross`: a decoder attending an encoder's output (Whisper, T5): the cross-attention keys and values made
  once per input (:class:`~.cross.CrossKeysValues`), :class:`~.cross.CrossAttention` (SDPA, not causal), the
  pre-norm :class:`~.cross.CrossDecoderLayer`, and :class:`~.cross.CrossDecoder`, ``text_decoder`` around them.

Each holds the general math.  A family whose math differs (an output gate,
soft-capped logits, interleaved experts) subclasses or composes one of these
in its own file under :mod:`coreai_partitioner.text_decoder.families`; a primitive
grows no option for one family.
"""

from coreai_partitioner.blocks.attention import Attention, AttentionShape
from coreai_partitioner.blocks.block import Block
from coreai_partitioner.blocks.encoder import MLP, EncoderAttention, EncoderLayer, PostNormEncoderLayer
from coreai_partitioner.blocks.cache import (
    WindowPlan,
    ring_positions_before,
    ring_slot,
    ring_write,
    window_plan,
    write_at,
    write_plan,
    written_only,
)
from coreai_partitioner.blocks.mlp import ACTIVATIONS, GatedMLP, activation
from coreai_partitioner.blocks.moe import MoE
from coreai_partitioner.blocks.norm import Norm, norm, norm_eps
from coreai_partitioner.blocks.recurrent import GatedDeltaNet, Recurrent, causal_conv
from coreai_partitioner.blocks.rope import RopeTable
from coreai_partitioner.blocks.step import Step

__all__ = [
    "ACTIVATIONS",
    "Attention",
    "AttentionShape",
    "Block",
    "EncoderAttention",
    "EncoderLayer",
    "MLP",
    "GatedDeltaNet",
    "GatedMLP",
    "MoE",
    "Norm",
    "PostNormEncoderLayer",
    "Recurrent",
    "RopeTable",
    "Step",
    "WindowPlan",
    "activation",
    "causal_conv",
    "norm",
    "norm_eps",
    "ring_positions_before",
    "ring_slot",
    "ring_write",
    "window_plan",
    "write_at",
    "write_plan",
    "written_only",
]
