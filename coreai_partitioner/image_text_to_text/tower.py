"""A vision tower (SigLIP, CLIP, Idefics3's SigLIP) over the Hugging Face model's own modules, for one image size.

A tower is patch embeddings (a convolution, position embeddings at fixed
ids, CLIP's class token), then :class:`~coreai_partitioner.blocks.EncoderLayer`
layers (bidirectional SDPA composite, HF's LayerNorms, which coreai-torch
converts to its ``layer_norm`` composite), then an optional final LayerNorm.
The image size is fixed at export: the position ids are read off Hugging
Face's own embedding code once, for that size (:func:`position_ids_of`), so
what it computes them with (Idefics3's ``bucketize`` over fractional
coordinates) never reaches the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from coreai_partitioner.blocks import MLP, EncoderAttention, EncoderLayer


def position_ids_of(position_embedding: nn.Embedding, run: Callable[[], object]) -> torch.Tensor:
    """The ids Hugging Face's own code looks ``position_embedding`` up with when ``run()`` embeds one image.

    ``run`` calls the HF embeddings module on an image of the size to export
    (zeros: only the ids matter); the ids are caught on their way into the
    embedding, so they are exactly HF's, whatever it computed them with.
    """
    caught: list[torch.Tensor] = []
    hook = position_embedding.register_forward_pre_hook(lambda module, args: caught.append(args[0].detach().clone()))
    try:
        with torch.no_grad():
            run()
    finally:
        hook.remove()
    if len(caught) != 1:
        raise RuntimeError(f"the embeddings looked their positions up {len(caught)} times for one image, not once")
    return caught[0].reshape(-1)


class PatchEmbeddings(nn.Module):
    """``conv(pixels)`` as ``[1, patches, width]`` plus the position embeddings at fixed ``position_ids``.

    ``class_embedding`` (CLIP) is a token put before the patches; the
    position ids then cover it too.  Ids in table order (SigLIP, CLIP, and
    Idefics3 at its full grid, as HF computes them) add the table itself: no
    integer ids reach the graph (the device form passes none to a delegate).
    """

    def __init__(
        self,
        conv: nn.Conv2d,
        position_embedding: nn.Embedding,
        position_ids: torch.Tensor,
        class_embedding: nn.Parameter | None = None,
    ) -> None:
        super().__init__()
        self.conv = conv
        self.position_embedding = position_embedding
        in_order = torch.equal(position_ids, torch.arange(position_embedding.num_embeddings))
        self.register_buffer("position_ids", None if in_order else position_ids.to(torch.long), persistent=False)
        self.class_embedding = class_embedding

    def positions(self) -> torch.Tensor:
        """``[patches, width]``: each patch's position embedding."""
        if self.position_ids is None:
            return self.position_embedding.weight
        return self.position_embedding(self.position_ids)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.conv(pixels.to(self.conv.weight.dtype)).flatten(2).transpose(1, 2)
        if self.class_embedding is not None:
            patches = torch.cat([self.class_embedding.view(1, 1, -1).to(patches.dtype), patches], dim=1)
        return patches + self.positions().unsqueeze(0)


def encoder_layer(layer: nn.Module, act: str, path: str) -> EncoderLayer:
    """:class:`EncoderLayer` over a SigLIP / CLIP / Idefics3 encoder layer's own modules (``self_attn``,
    ``mlp``, ``layer_norm1``, ``layer_norm2``)."""
    attn = layer.self_attn
    attention = EncoderAttention(
        path, attn.num_heads, attn.head_dim, q=attn.q_proj, k=attn.k_proj, v=attn.v_proj, o=attn.out_proj, scale=attn.scale
    )
    return EncoderLayer(attention, MLP(act, fc1=layer.mlp.fc1, fc2=layer.mlp.fc2), norm1=layer.layer_norm1, norm2=layer.layer_norm2)


class VisionTower(nn.Module):
    """``pixels [1, 3, H, W] -> [1, tokens, width]``: patch embeddings, ``pre_norm``, the layers, ``post_norm``."""

    def __init__(
        self,
        embeddings: PatchEmbeddings,
        layers: Sequence[EncoderLayer],
        *,
        pre_norm: nn.Module | None = None,
        post_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.pre_norm = pre_norm
        self.layers = nn.ModuleList(layers)
        self.post_norm = post_norm

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        hidden = self.embeddings(pixels)
        if self.pre_norm is not None:
            hidden = self.pre_norm(hidden)
        for layer in self.layers:
            hidden = layer(hidden)
        if self.post_norm is not None:
            hidden = self.post_norm(hidden)
        return hidden


def tower(
    hf_tower: nn.Module,
    config,
    *,
    layers: int | None = None,
    post_norm: bool = True,
    embed: Callable[[torch.Tensor], object] | None = None,
    path: str = "vision_tower",
) -> VisionTower:
    """:class:`VisionTower` over an HF SigLIP, CLIP or Idefics3 vision model (``embeddings``, ``encoder.layers``,
    ``post_layernorm``, CLIP's ``pre_layrnorm``), for ``config.image_size``.

    ``layers`` keeps only the first ones (LLaVA's features come from an
    earlier layer), ``post_norm=False`` leaves the final LayerNorm out.
    ``embed(pixels)`` runs HF's embeddings on an image (default:
    ``hf_tower.embeddings(pixel_values=pixels)``), to read their position ids.
    """
    hf_tower = getattr(hf_tower, "vision_model", hf_tower)  # transformers 5.0's SigLIP and CLIP models wrap their transformer
    embeddings = hf_tower.embeddings
    size = config.image_size
    zeros = torch.zeros(1, config.num_channels, size, size, dtype=embeddings.patch_embedding.weight.dtype)
    run = (lambda: embed(zeros)) if embed is not None else (lambda: embeddings(pixel_values=zeros))
    ids = position_ids_of(embeddings.position_embedding, run)
    patches = PatchEmbeddings(
        embeddings.patch_embedding, embeddings.position_embedding, ids, getattr(embeddings, "class_embedding", None)
    )
    hf_layers = list(hf_tower.encoder.layers)[: layers if layers is not None else None]
    return VisionTower(
        patches,
        [encoder_layer(layer, config.hidden_act, f"{path}.encoder.layers.{i}") for i, layer in enumerate(hf_layers)],
        pre_norm=getattr(hf_tower, "pre_layrnorm", None),
        post_norm=hf_tower.post_layernorm if post_norm else None,
    )
