"""Export a diffusers Stable Diffusion pipeline to a .pte that draws: ``text_encoder``, ``denoiser``, ``vae_decoder``.

    python -m coreai_partitioner export --checkpoint path/to/sd-pipeline --height 512 --width 512 --out out/model.pte
    python -m coreai_partitioner export --config stable-diffusion --verify --out out/model.pte   # a tiny random pipeline
    python -m coreai_partitioner generate-image out/model.pte --prompt "a red cat" --seed 0 --steps 25 --out image.png

(the task is a pipeline directory's, one with a ``model_index.json`` naming
``StableDiffusionPipeline``: SD 1.x/2.x.)  The .pte has three methods
(:mod:`coreai_partitioner.text_to_image.stable_diffusion`), one Core AI
delegate each, the weights stored once, the resolution fixed by
``--height``/``--width``; classifier-free guidance is batch 2 inside
``denoiser``.  Beside it go the pipeline's CLIP tokenizer and its
``scheduler_config.json`` (``--scheduler NAME`` writes one of the schedulers
the loop steps instead, built from the same config: SD 1.5's PNDM is not one).
``generate-image`` is the loop (diffusers' scheduler, the initial latents
drawn as diffusers draws them from ``--seed``).  ``--verify`` judges the image
of a fixed prompt against diffusers' ``StableDiffusionPipeline`` on the fp32
parts at the same seed, scheduler and 4 steps.  Host form.  Nothing is
downloaded.  Needs the diffusers extra.
"""

from __future__ import annotations

from coreai_partitioner import _compat

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.cli.command import CommandError
from coreai_partitioner.cli.detect import Detection
from coreai_partitioner.cli.task import Phases, Plan, host_form_only, partitioner_options
from coreai_partitioner.text_to_image.schedulers import NOISE_PREDICTION

NAME = "text-to-image"
DETECT = Detection(takes="a diffusers Stable Diffusion pipeline directory (model_index.json)", files=("model_index.json",))
MODEL = "StableDiffusionPipeline"
RUNNER = "this package's generate-image loop (python -m coreai_partitioner generate-image)"
FLAGS = ("--quantize",)
DEFAULTS: dict[str, Any] = {}
#: ``--verify``'s run: a fixed prompt, seed, step count and guidance, against diffusers' pipeline.
VERIFY_PROMPT, VERIFY_SEED, VERIFY_STEPS, VERIFY_GUIDANCE = "a photograph of an astronaut riding a horse", 0, 4, 7.5
#: How close the .pte's image is to diffusers' (PSNR of the 8-bit images): the issue's bound in fp32, fp16's measured
#: floor (software fp16 accumulating in fp16, docs/text-to-image.md) with margin.
LEAST_PSNR_DB = {"fp32": 40.0, "fp16": 30.0}


def tiny_configs() -> list[str]:
    from coreai_partitioner.text_to_image.tiny import NAMES

    return list(NAMES)


def tiny_config(name: str) -> Any:
    from coreai_partitioner.text_to_image.tiny import tiny_config

    return tiny_config(name)


def load_config(checkpoint: Path) -> Any:
    """The pipeline directory's configs (no weights): ``model_index.json`` and each part's."""
    from coreai_partitioner.text_to_image.pipeline import read_pipeline

    return read_pipeline(checkpoint)


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--height", type=int, help="the image height in pixels (default: the pipeline's own)")
    parser.add_argument("--width", type=int, help="the image width in pixels (default: the pipeline's own)")
    parser.add_argument("--scheduler", choices=NOISE_PREDICTION,
                        help="the scheduler written beside the .pte, built from the pipeline's config (default: the "
                             "pipeline's own)")


def refusals() -> tuple[type[Exception], ...]:
    from coreai_partitioner.text_to_image.pipeline import UnsupportedPipeline
    from coreai_partitioner.text_to_image.schedulers import UnsupportedScheduler

    return (UnsupportedPipeline, UnsupportedScheduler)


@dataclass
class ImagePlan(Plan):
    height: int = 0
    width: int = 0
    scheduler: dict[str, Any] | None = None  # the config written beside the .pte
    clip_tokenizer: Any = None


def settle(args: argparse.Namespace, config: Any) -> ImagePlan:
    """The resolution the pipeline can make, a scheduler the loop steps, the tokenizer, fp32 or fp16, host form."""
    from coreai_partitioner.text_to_image.schedulers import build_scheduler
    from coreai_partitioner.text_to_image.stable_diffusion import latent_size

    host_form_only(NAME, args)
    native = config.sample_size * config.vae_scale
    height, width = args.height or native, args.width or native
    latent_size(config, height, width)
    scheduler = dict(build_scheduler(config.scheduler, args.scheduler).config)
    return ImagePlan(args, config, runner_tokenizer=False, height=height, width=width, scheduler=scheduler,
                     clip_tokenizer=_tokenizer(args, config))


def _tokenizer(args: argparse.Namespace, config: Any) -> Any:
    from transformers import CLIPTokenizer

    if not args.checkpoint:
        from coreai_partitioner.text_to_image.tiny import tiny_tokenizer

        return tiny_tokenizer()
    folder = args.checkpoint / "tokenizer"
    try:
        return CLIPTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as error:
        raise CommandError(f"{folder}: no CLIP tokenizer ({error}); the pipeline directory needs its tokenizer folder") from None


def dry_run(plan: ImagePlan) -> None:
    config, args = plan.config, plan.args
    h, w = plan.height // config.vae_scale, plan.width // config.vae_scale
    text = config.text_encoder
    print(f"{config.class_name}: {plan.height}x{plan.width}, {args.dtype}, host form, scheduler {plan.scheduler[_compat.DIFFUSERS_CLASS]}")
    print(f"  text_encoder(input_ids [1, {text.max_position_embeddings}]) -> [1, {text.max_position_embeddings}, {text.hidden_size}]")
    print(f"  denoiser(latents [1, {config.latent_channels}, {h}, {w}], timestep [1], text [2, {text.max_position_embeddings}, "
          f"{text.hidden_size}], guidance [1]) -> [1, {config.latent_channels}, {h}, {w}]")
    print(f"  vae_decoder(latents [1, {config.latent_channels}, {h}, {w}]) -> image [1, 3, {plan.height}, {plan.width}]")
    print(f"  would write {args.out}, its tokenizer and scheduler_config.json")


# ---------------------------------------------------------------- export


def load_model(plan: ImagePlan, dtype: torch.dtype) -> torch.nn.Module:
    """The pipeline's parts at ``dtype`` (a tiny pipeline's made seeded in fp32, then cast)."""
    from coreai_partitioner.text_to_image.pipeline import load_parts
    from coreai_partitioner.text_to_image.tiny import tiny_model

    if plan.args.checkpoint:
        return load_parts(plan.config, dtype)
    return tiny_model(plan.config).to(dtype)


def reference(plan: ImagePlan, model: torch.nn.Module) -> torch.Tensor:
    """diffusers' ``StableDiffusionPipeline`` on the fp32 parts: the 8-bit image ``[H, W, 3]`` of the fixed prompt."""
    from diffusers import StableDiffusionPipeline

    from coreai_partitioner.text_to_image.schedulers import build_scheduler

    pipeline = StableDiffusionPipeline(
        vae=model.vae, text_encoder=model.text_encoder, tokenizer=plan.clip_tokenizer, unet=model.unet,
        scheduler=build_scheduler(plan.scheduler), safety_checker=None, feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.set_progress_bar_config(disable=True)
    image = pipeline(
        VERIFY_PROMPT, height=plan.height, width=plan.width, num_inference_steps=VERIFY_STEPS,
        guidance_scale=VERIFY_GUIDANCE, generator=torch.Generator().manual_seed(VERIFY_SEED), output_type="np",
    ).images[0]
    return torch.from_numpy((image * 255).round().astype("uint8"))


def lower(plan: ImagePlan, model: torch.nn.Module, verified: Any, phases: Phases) -> tuple[Any, Any]:
    """The three methods lowered; under ``--verify --quantize`` the image the quantized eager methods draw through the
    same loop (what the ``.pte`` must draw), ``None`` otherwise (diffusers' pipeline is the reference)."""
    from coreai_partitioner.text_to_image import lower_stable_diffusion
    from coreai_partitioner.text_to_image.loop import EagerMethods
    from coreai_partitioner.text_to_image.stable_diffusion import constant_methods

    held: dict | None = {} if verified is not None and plan.args.quantize else None
    with phases("export and lower"):
        lowered = lower_stable_diffusion(
            model, height=plan.height, width=plan.width, quantize=plan.args.quantize, quantized_reference=held,
            **partitioner_options(plan.args),
        )
    if not held:
        return lowered, None
    with phases("quantized reference"):
        return lowered, _verify_run(plan, EagerMethods(held, constant_methods(plan.config, plan.height, plan.width)))


def _verify_run(plan: ImagePlan, program: Any) -> torch.Tensor:
    """``--verify``'s prompt, seed, steps and guidance through the loop on ``program`` (a ``.pte``'s or eager methods)."""
    from coreai_partitioner.text_to_image import generate

    return generate(
        program, VERIFY_PROMPT, seed=VERIFY_SEED, steps=VERIFY_STEPS, guidance=VERIFY_GUIDANCE,
        tokenizer=plan.clip_tokenizer, scheduler_config=plan.scheduler,
    )


def describe(plan: ImagePlan, model: torch.nn.Module, pte: Any) -> None:
    print(f"{plan.config.class_name}: {plan.args.dtype}, {plan.height}x{plan.width}, scheduler {plan.scheduler[_compat.DIFFUSERS_CLASS]}")
    print(f"  methods: {', '.join(pte.methods)}")
    for method in ("text_encoder", "denoiser", "vae_decoder"):
        print(f"  {method}: {len(pte.coreai_delegates(method))} Core AI delegate(s)")


@dataclass(frozen=True)
class ImageReport:
    """The .pte's image against the reference's at the same prompt, seed, scheduler and steps: diffusers' pipeline,
    or for a quantized .pte its quantized eager methods (and diffusers' fp32 pipeline for the record)."""

    psnr_db: float
    least: float
    against: str = "diffusers' StableDiffusionPipeline at the same seed"
    fp32_psnr_db: float | None = None  # a quantized .pte's image against diffusers' fp32 pipeline's

    @property
    def ok(self) -> bool:
        return self.psnr_db >= self.least

    def __str__(self) -> str:
        fp32 = "" if self.fp32_psnr_db is None else f"; against diffusers' fp32 pipeline {self.fp32_psnr_db:.1f} dB"
        return (
            f"verify: {VERIFY_PROMPT!r}, seed {VERIFY_SEED}, {VERIFY_STEPS} steps, guidance {VERIFY_GUIDANCE} through the "
            f"three methods against {self.against}, the check:\n"
            f"  PSNR {self.psnr_db:.1f} dB (at least {self.least:.0f}) {'ok' if self.ok else 'FAILED'}{fp32}"
        )


def psnr(image: torch.Tensor, expected: torch.Tensor) -> float:
    """PSNR of two 8-bit images, in dB (infinite where they are equal)."""
    error = (image.double() - expected.double()).pow(2).mean()
    return float("inf") if error == 0 else float(10 * torch.log10(255.0**2 / error))


def check(plan: ImagePlan, path: Path, verified: torch.Tensor, eager: Any) -> ImageReport:
    from coreai_partitioner.text_to_image import ImageProgram

    image = _verify_run(plan, ImageProgram(path))
    least = LEAST_PSNR_DB[plan.args.dtype]
    if eager is None:
        return ImageReport(psnr(image, verified), least)
    against = f"its {plan.args.quantize} eager methods through the same loop"
    return ImageReport(psnr(image, eager), least, against, fp32_psnr_db=psnr(image, verified))


def companions(plan: ImagePlan, directory: Path) -> list[Path]:
    """The CLIP tokenizer and the scheduler's config, which ``generate-image`` reads beside the ``.pte``."""
    from coreai_partitioner.text_to_image.pipeline import SCHEDULER_CONFIG

    written = [Path(path) for path in plan.clip_tokenizer.save_pretrained(directory) if Path(path).is_file()]
    scheduler = directory / SCHEDULER_CONFIG
    scheduler.write_text(json.dumps(plan.scheduler, indent=2, default=list) + "\n")
    return [*written, scheduler]


def after(plan: ImagePlan) -> None:
    """Nothing: ``generate-image`` runs the .pte."""


# ---------------------------------------------------------------- generate-image


def add_generate_command(commands: Any) -> None:
    """``generate-image PTE --prompt ... [--seed N] [--steps K] [--guidance G] [--out image.png]``."""
    parser = commands.add_parser("generate-image", help="run a text-to-image .pte (export's text-to-image task) and write a PNG")
    parser.add_argument("pte", type=Path)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--negative-prompt", default="")
    parser.add_argument("--seed", type=int, default=0,
                        help="the initial latents' seed: diffusers' image at generator=torch.Generator().manual_seed(SEED)")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--guidance", type=float, default=7.5, help="classifier-free guidance scale (at most 1: none)")
    parser.add_argument("--scheduler", choices=NOISE_PREDICTION,
                        help="the scheduler to step, built from the scheduler_config.json beside the .pte (default: that "
                             "config's own)")
    parser.add_argument("--out", type=Path, default=Path("image.png"))
    parser.set_defaults(run=generate_image)


def generate_image(args: argparse.Namespace) -> int:
    """The loop (:func:`coreai_partitioner.text_to_image.generate`) and the PNG; 2 for a .pte or flag it refuses."""
    import sys

    from coreai_partitioner import console
    from coreai_partitioner.text_to_image import ImageProgram, generate, write_png

    try:
        with console.NativeStreams():  # the Core AI runtime's own lines as it loads each function
            image = generate(
                ImageProgram(args.pte), args.prompt, negative_prompt=args.negative_prompt, seed=args.seed,
                steps=args.steps, guidance=args.guidance, scheduler=args.scheduler,
            )
    except (ValueError, RuntimeError) as error:
        print(f"generate-image: {error}", file=sys.stderr)
        return 2
    write_png(image, args.out)
    print(f"wrote {args.out}: {image.shape[1]}x{image.shape[0]}")
    return 0
