"""A diffusers pipeline directory read as the text-to-image export takes it: its family, its parts, its scheduler.

A pipeline directory (what ``DiffusionPipeline.save_pretrained`` writes) has
a ``model_index.json`` naming the pipeline class and, for each part, the
library and class in its folder.  :data:`FAMILIES` says which pipeline
classes this export takes and the parts each needs: Stable Diffusion 1.x/2.x
(a CLIP text encoder, a ``UNet2DConditionModel``, an ``AutoencoderKL``) and
SD3-class MMDiT (two CLIP text encoders with projections, an optional T5
encoder, an ``SD3Transformer2DModel``, an ``AutoencoderKL``).
:func:`read_pipeline` reads the configs alone (for the checks and the dry run,
before any weights); :func:`load_parts` loads the parts the ``.pte`` holds,
as :class:`Parts`, one module (so the export counts its weights once).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from coreai_partitioner import _compat


@dataclass(frozen=True)
class Family:
    """A family of pipelines: its name, the loop's family code (a constant method of the ``.pte``), the parts it needs
    and may have (folder -> class), and the schedulers the loop steps for it."""

    name: str
    code: int
    parts: dict[str, str]
    optional: dict[str, str]
    schedulers: tuple[str, ...]


STABLE_DIFFUSION = Family(
    "stable-diffusion", 1, {"text_encoder": "CLIPTextModel", "unet": "UNet2DConditionModel", "vae": "AutoencoderKL"}, {},
    ("ddim", "euler", "euler-ancestral"),
)
STABLE_DIFFUSION_3 = Family(
    "stable-diffusion-3", 3,
    {"text_encoder": "CLIPTextModelWithProjection", "text_encoder_2": "CLIPTextModelWithProjection",
     "transformer": "SD3Transformer2DModel", "vae": "AutoencoderKL"},
    {"text_encoder_3": "T5EncoderModel"},
    ("flow-match-euler",),
)
#: The pipeline classes this export takes, by ``model_index.json``'s class field.
FAMILIES = {
    "StableDiffusionPipeline": STABLE_DIFFUSION,
    "StableDiffusionImg2ImgPipeline": STABLE_DIFFUSION,
    "StableDiffusion3Pipeline": STABLE_DIFFUSION_3,
    "StableDiffusion3Img2ImgPipeline": STABLE_DIFFUSION_3,
}
#: The libraries a part's class comes from, as ``model_index.json`` names them.
LIBRARIES = ("transformers", "diffusers")
#: What the loop reads beside the ``.pte``: the scheduler's config (and a folder per tokenizer).
SCHEDULER_CONFIG = "scheduler_config.json"


class UnsupportedPipeline(ValueError):
    """A pipeline this export does not take; names the file, the field and the fix."""


@dataclass
class PipelineConfig:
    """A pipeline's configs, read without its weights: each part's config by folder (a transformers config, or a
    diffusers config dict) and the scheduler's."""

    class_name: str
    parts: dict[str, Any]
    scheduler: dict[str, Any]
    directory: Path | None = None  # None: a tiny random pipeline

    @property
    def family(self) -> Family:
        return FAMILIES[self.class_name]

    @property
    def text_encoder(self) -> Any:
        return self.parts["text_encoder"]

    @property
    def vae(self) -> dict[str, Any]:
        return self.parts["vae"]

    @property
    def denoiser(self) -> dict[str, Any]:
        """The UNet's or the MMDiT's config."""
        return self.parts.get("unet") or self.parts["transformer"]

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
    def shift_factor(self) -> float:
        """What the latents are shifted by after scaling, before the VAE decodes them (SD3's; 0 for SD 1.x/2.x)."""
        return float(self.vae.get("shift_factor") or 0.0)

    @property
    def sample_size(self) -> int:
        """The denoiser's native latent side (``sample_size``): the pipeline's default resolution over ``vae_scale``."""
        size = self.denoiser.get("sample_size", 64)
        return int(size if isinstance(size, int) else size[0])


def read_pipeline(directory: Path) -> PipelineConfig:
    """``directory``'s configs, checked (:func:`check_config`); no weights are read."""
    index_path = directory / "model_index.json"
    index = _json(index_path)
    class_name = index.get(_compat.DIFFUSERS_CLASS, "")
    family = family_of(class_name, index_path)
    parts = {}
    for folder, expected in {**family.parts, **family.optional}.items():
        entry = index.get(folder) or [None, None]
        if entry[-1] is None and folder in family.optional:
            continue
        if entry[-1] != expected or entry[0] not in LIBRARIES:
            raise UnsupportedPipeline(
                f"{index_path}: {folder} is {entry!r}; a {class_name} export needs a {expected} there"
            )
        parts[folder] = _part_config(directory / folder, entry[0])
    config = PipelineConfig(class_name, parts, _json(directory / "scheduler" / SCHEDULER_CONFIG), directory)
    check_config(config)
    return config


def _part_config(folder: Path, library: str) -> Any:
    if library == "transformers":
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(folder, local_files_only=True)
    return _json(folder / "config.json")


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UnsupportedPipeline(f"{path}: missing; give a diffusers pipeline directory (DiffusionPipeline.save_pretrained)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UnsupportedPipeline(f"{path}: not JSON ({error})") from None


def family_of(class_name: str, where: Any) -> Family:
    if class_name not in FAMILIES:
        raise UnsupportedPipeline(
            f"{where}: class {class_name!r}; text-to-image exports {', '.join(FAMILIES)} (SD 1.x/2.x: a CLIP text "
            "encoder, a UNet2DConditionModel, an AutoencoderKL; SD3: two CLIP text encoders, T5 optional, an "
            "SD3Transformer2DModel, an AutoencoderKL)"
        )
    return FAMILIES[class_name]


def check_config(config: PipelineConfig) -> None:
    """Refuse, from the configs alone, what the methods do not carry: extra UNet conditioning (SDXL's, a class
    embedding, LCM's guidance embedding), parts of different pipelines.  (The scheduler is the loop's: the task checks
    it, with ``--scheduler``.)"""
    denoiser = config.denoiser
    for key in ("addition_embed_type", "class_embed_type", "time_cond_proj_dim", "encoder_hid_dim"):
        if denoiser.get(key) is not None:
            raise UnsupportedPipeline(
                f"unet/config.json: {key}={denoiser[key]!r}; the denoiser method takes latents, a timestep and the "
                "text's hidden states only (SD 1.x/2.x): this UNet needs more conditioning than that"
            )
    if config.family is STABLE_DIFFUSION:
        _same(denoiser.get("cross_attention_dim"), config.text_encoder.hidden_size, "unet's cross_attention_dim",
              "the text encoder's hidden_size")
        return
    clips = [config.text_encoder, config.parts["text_encoder_2"]]
    _same(denoiser.get("pooled_projection_dim"), sum(clip.projection_dim for clip in clips),
          "transformer's pooled_projection_dim", "the CLIP encoders' projection_dims added")
    joint = denoiser.get("joint_attention_dim")
    if "text_encoder_3" in config.parts:
        _same(joint, config.parts["text_encoder_3"].d_model, "transformer's joint_attention_dim", "the T5 encoder's d_model")
    if joint is not None and joint < sum(clip.hidden_size for clip in clips):
        raise UnsupportedPipeline(
            f"transformer's joint_attention_dim={joint} is less than the CLIP encoders' hidden sizes added "
            f"({sum(clip.hidden_size for clip in clips)}), which diffusers pads up to it: not one pipeline's parts"
        )


def _same(found: Any, expected: int, what: str, against: str) -> None:
    if found is not None and found != expected:
        raise UnsupportedPipeline(f"{what} is {found} but {against} is {expected}: not one pipeline's parts")


class Parts(nn.Module):
    """The parts of a pipeline the ``.pte`` holds, as one module: each an attribute by its folder's name."""

    def __init__(self, modules: dict[str, nn.Module], config: PipelineConfig) -> None:
        super().__init__()
        for folder, module in modules.items():
            self.add_module(folder, module)
        self.folders = tuple(modules)
        self.pipeline_config = config


def load_parts(config: PipelineConfig, dtype: torch.dtype) -> Parts:
    """Each part of ``config.directory`` at ``dtype``, in eval mode, by the library and class ``model_index.json``
    names."""
    index = json.loads((config.directory / "model_index.json").read_text())
    modules = {}
    for folder in config.parts:
        library, class_name = index[folder]
        cls = getattr(importlib.import_module(library), class_name)
        options = {"dtype": dtype, "attn_implementation": "eager"} if library == "transformers" else {"torch_dtype": dtype}
        modules[folder] = cls.from_pretrained(config.directory / folder, local_files_only=True, **options)
    return Parts(modules, config).eval()
