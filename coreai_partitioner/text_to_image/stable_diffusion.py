"""A Stable Diffusion 1.x/2.x pipeline as three methods of one ``.pte``: ``text_encoder``, ``denoiser``, ``vae_decoder``.

- :class:`TextEncoder`, ``text_encoder(input_ids [1, L]) -> hidden states
  [1, L, D]``: CLIP's last hidden state, what diffusers' pipeline conditions on;
- :class:`Denoiser`, ``denoiser(latents [1, C, h, w], timestep [1] (fp32),
  text [2, L, D], guidance [1]) -> noise [1, C, h, w]``: the UNet run once at
  batch 2 on the latents twice, against the negative prompt's hidden states
  (``text[0]``) and the prompt's (``text[1]``), combined with classifier-free
  guidance as diffusers combines them.  Batch 2 inside one call (as
  apple/ml-stable-diffusion's UNet takes it), not two calls: the UNet's
  weights are read once a step, one delegate runs, and the loop makes half the
  calls;
- :class:`VaeDecoder`, ``vae_decoder(latents [1, C, h, w]) -> image [1, 3, H, W]``:
  the latents over the VAE's scaling factor decoded, and mapped to ``[0, 1]``
  as diffusers' image processor maps them.

The resolution is fixed when the program is made (``H = h * vae_scale``).  The
loop between them is :mod:`.loop`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coreai_partitioner.text_to_image.pipeline import Parts, UnsupportedPipeline

#: The methods of the ``.pte``, in the order a run calls them.
METHODS = ("text_encoder", "denoiser", "vae_decoder")


class TextEncoder(nn.Module):
    """CLIP's text encoder to its last hidden state (SD 1.x/2.x's conditioning)."""

    def __init__(self, text_encoder: nn.Module) -> None:
        super().__init__()
        self.text_encoder = text_encoder

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.text_encoder(input_ids=input_ids).last_hidden_state


class Denoiser(nn.Module):
    """The UNet at batch 2 (negative prompt, prompt) and classifier-free guidance: one step's noise prediction."""

    def __init__(self, unet: nn.Module) -> None:
        super().__init__()
        self.unet = unet

    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor, guidance: torch.Tensor):
        noise = self.unet(torch.cat([latents, latents]), timestep, encoder_hidden_states=text, return_dict=False)[0]
        unconditional, conditional = noise.chunk(2)
        return unconditional + guidance * (conditional - unconditional)


class VaeDecoder(nn.Module):
    """The VAE's decoder on latents over its scaling factor, the image mapped from ``[-1, 1]`` to ``[0, 1]``."""

    def __init__(self, vae: nn.Module, scaling_factor: float) -> None:
        super().__init__()
        self.vae = vae
        self.scaling_factor = scaling_factor

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        image = self.vae.decode(latents / self.scaling_factor, return_dict=False)[0]
        return (image * 0.5 + 0.5).clamp(0, 1)


def latent_size(parts_config: Any, height: int, width: int) -> tuple[int, int]:
    """The latents' ``(h, w)`` for an image of ``height`` x ``width``; refused where the VAE cannot make that size."""
    scale = parts_config.vae_scale
    # the UNet halves the latents once per down block but the last, and must meet them again going up
    multiple = scale * 2 ** (len(parts_config.unet["down_block_types"]) - 1)
    if height < multiple or width < multiple or height % multiple or width % multiple:
        raise UnsupportedPipeline(
            f"--height {height} --width {width}: this pipeline makes images whose sides are multiples of {multiple} "
            f"(its VAE's scale {scale} times its UNet's downsampling)"
        )
    return height // scale, width // scale


def method_modules(parts: Parts) -> dict[str, nn.Module]:
    config = parts.pipeline_config
    return {
        "text_encoder": TextEncoder(parts.text_encoder).eval(),
        "denoiser": Denoiser(parts.unet).eval(),
        "vae_decoder": VaeDecoder(parts.vae, config.scaling_factor).eval(),
    }


def method_samples(parts: Parts, height: int, width: int) -> dict[str, tuple[torch.Tensor, ...]]:
    config = parts.pipeline_config
    h, w = latent_size(config, height, width)
    dtype = parts.unet.dtype
    text = config.text_encoder
    latents = torch.zeros(1, config.latent_channels, h, w, dtype=dtype)
    return {
        "text_encoder": (torch.zeros(1, text.max_position_embeddings, dtype=torch.long),),
        "denoiser": (
            latents, torch.ones(1), torch.zeros(2, text.max_position_embeddings, text.hidden_size, dtype=dtype),
            torch.ones(1, dtype=dtype),
        ),
        "vae_decoder": (latents,),
    }


def constant_methods(config: Any, height: int, width: int) -> dict[str, int]:
    """What the loop reads off the ``.pte``: ``get_height``, ``get_width``, ``get_latent_channels``,
    ``get_vae_scale``, ``get_max_text_len`` (the ids' length ``L``)."""
    return {
        "get_height": height,
        "get_width": width,
        "get_latent_channels": config.latent_channels,
        "get_vae_scale": config.vae_scale,
        "get_max_text_len": config.text_encoder.max_position_embeddings,
    }


def lower_stable_diffusion(
    parts: Parts, *, height: int, width: int, quantize: Any = None, quantized_reference: dict | None = None,
    **partitioner_options: Any,
):
    """The three methods lowered to one ``.pte`` (one asset: each weight stored once,
    :func:`~coreai_partitioner.lowering.methods.lower_method_modules`) at ``height`` x ``width``, the weights stored as
    ``quantize`` (a scheme of :data:`coreai_partitioner.quantize.SCHEMES`, or ``None``) says (``quantized_reference``,
    a dict, receives each method's quantized eager module); the ``EdgeProgramManager``, with
    :func:`constant_methods`.
    """
    from coreai_partitioner.lowering.methods import lower_method_modules

    return lower_method_modules(
        method_modules(parts), method_samples(parts, height, width), device=False,
        constant_methods=constant_methods(parts.pipeline_config, height, width), quantize=quantize,
        quantized_reference=quantized_reference, **partitioner_options,
    )
