"""A diffusers pipeline directory read as the text-to-image export takes it: its family, its parts, its scheduler.

A pipeline directory (what ``DiffusionPipeline.save_pretrained`` writes) has
a ``model_index.json`` naming the pipeline class and one folder per part.
:func:`read_pipeline` reads the configs alone (for the checks and the dry
run, before any weights); :func:`load_parts` loads the parts the ``.pte``
holds, as :class:`Parts`, one module (so the export counts its weights once).
"""

from __future__ import annotations

from coreai_partitioner import _compat

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: The pipeline classes of the family this export takes, by ``model_index.json``'s ``_class_name``.
STABLE_DIFFUSION = ("StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline")
#: The parts a pipeline directory of the family needs, and the class each folder must hold.
PARTS = {"text_encoder": "CLIPTextModel", "unet": "UNet2DConditionModel", "vae": "AutoencoderKL"}
#: What the loop reads beside the ``.pte``: the tokenizer's files and the scheduler's config.
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")
SCHEDULER_CONFIG = "scheduler_config.json"


class UnsupportedPipeline(ValueError):
    """A pipeline this export does not take; names the file, the field and the fix."""


@dataclass
class PipelineConfig:
    """A pipeline's configs, read without its weights: the parts' configs by folder and the scheduler's."""

    class_name: str
    text_encoder: Any  # a transformers CLIPTextConfig
    unet: dict[str, Any]
    vae: dict[str, Any]
    scheduler: dict[str, Any]
    directory: Path | None = None  # None: a tiny random pipeline
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def latent_channels(self) -> int:
        return int(self.vae["latent_channels"])

    @property
    def vae_scale(self) -> int:
        """Pixels per latent along each side: 2 per down block of the VAE after its first."""
        return 2 ** (len(self.vae["block_out_channels"]) - 1)

    @property
    def scaling_factor(self) -> float:
        return float(self.vae.get("scaling_factor", 0.18215))

    @property
    def sample_size(self) -> int:
        """The UNet's native latent side (``unet.sample_size``): the pipeline's default resolution over ``vae_scale``."""
        size = self.unet.get("sample_size", 64)
        return int(size if isinstance(size, int) else size[0])

    def to_dict(self) -> dict[str, Any]:
        return {_compat.DIFFUSERS_CLASS: self.class_name}


def read_pipeline(directory: Path) -> PipelineConfig:
    """``directory``'s configs, checked (:func:`check_config`); no weights are read."""
    from transformers import CLIPTextConfig

    index = _json(directory / "model_index.json")
    class_name = index.get(_compat.DIFFUSERS_CLASS, "")
    check_class(class_name, directory / "model_index.json")
    for folder, expected in PARTS.items():
        entry = index.get(folder)
        if not entry or entry[-1] != expected:
            raise UnsupportedPipeline(
                f"{directory / 'model_index.json'}: {folder} is {entry!r}; a {class_name} export needs a {expected} there"
            )
    config = PipelineConfig(
        class_name,
        CLIPTextConfig.from_pretrained(directory / "text_encoder", local_files_only=True),
        _json(directory / "unet" / "config.json"),
        _json(directory / "vae" / "config.json"),
        _json(directory / "scheduler" / SCHEDULER_CONFIG),
        directory,
    )
    check_config(config)
    return config


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UnsupportedPipeline(f"{path}: missing; give a diffusers pipeline directory (DiffusionPipeline.save_pretrained)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UnsupportedPipeline(f"{path}: not JSON ({error})") from None


def check_class(class_name: str, where: Any) -> None:
    if class_name not in STABLE_DIFFUSION:
        hint = (
            "; SD3-class MMDiT pipelines are not exported yet" if class_name.startswith("StableDiffusion3") else ""
        )
        raise UnsupportedPipeline(
            f"{where}: _class_name {class_name!r}; text-to-image exports {', '.join(STABLE_DIFFUSION)} "
            f"(SD 1.x/2.x: a CLIP text encoder, a UNet2DConditionModel, an AutoencoderKL){hint}"
        )


def check_config(config: PipelineConfig) -> None:
    """Refuse, from the configs alone, what the methods do not carry: extra UNet conditioning (SDXL's, a class
    embedding, LCM's guidance embedding).  (The scheduler is the loop's: the task checks it, with ``--scheduler``.)"""
    unet = config.unet
    for key in ("addition_embed_type", "class_embed_type", "time_cond_proj_dim", "encoder_hid_dim"):
        if unet.get(key) is not None:
            raise UnsupportedPipeline(
                f"unet/config.json: {key}={unet[key]!r}; the denoiser method takes latents, a timestep and the text's "
                "hidden states only (SD 1.x/2.x): this UNet needs more conditioning than that"
            )
    if unet.get("cross_attention_dim") not in (None, config.text_encoder.hidden_size):
        raise UnsupportedPipeline(
            f"unet/config.json: cross_attention_dim={unet['cross_attention_dim']} but the text encoder's hidden_size is "
            f"{config.text_encoder.hidden_size}: not one pipeline's parts"
        )


class Parts(nn.Module):
    """The parts of a Stable Diffusion pipeline the ``.pte`` holds, as one module."""

    def __init__(self, text_encoder: nn.Module, unet: nn.Module, vae: nn.Module, config: PipelineConfig) -> None:
        super().__init__()
        self.text_encoder, self.unet, self.vae = text_encoder, unet, vae
        self.pipeline_config = config


def load_parts(config: PipelineConfig, dtype: torch.dtype) -> Parts:
    """The text encoder, UNet and VAE of ``config.directory`` at ``dtype``, in eval mode."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel

    directory = config.directory
    text_encoder = CLIPTextModel.from_pretrained(
        directory / "text_encoder", dtype=dtype, local_files_only=True, attn_implementation="eager"
    )
    unet = UNet2DConditionModel.from_pretrained(directory / "unet", torch_dtype=dtype, local_files_only=True)
    vae = AutoencoderKL.from_pretrained(directory / "vae", torch_dtype=dtype, local_files_only=True)
    return Parts(text_encoder, unet, vae, config).eval()
