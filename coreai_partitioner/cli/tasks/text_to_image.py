"""Export a diffusers Stable Diffusion pipeline (SD 1.x/2.x, SD3) to a .pte that draws: text encoders, denoiser, VAE decoder.

    python -m coreai_partitioner export --checkpoint path/to/sd-pipeline --height 512 --width 512 --out out/model.pte
    python -m coreai_partitioner export --config stable-diffusion --verify --out out/model.pte   # a tiny random pipeline
    python -m coreai_partitioner export --config stable-diffusion-3 --verify --out sd3/model.pte # a tiny random SD3
    python -m coreai_partitioner generate-image out/model.pte --prompt "a red cat" --seed 0 --steps 25 --out image.png

(the task is a pipeline directory's, one with a ``model_index.json`` naming
``StableDiffusionPipeline`` or ``StableDiffusion3Pipeline``.)  The .pte has
the family's methods (:mod:`coreai_partitioner.text_to_image.stable_diffusion`):
its text encoders, ``denoiser`` and ``vae_decoder``, one Core AI delegate
each, the weights stored once, the resolution fixed by
``--height``/``--width``; classifier-free guidance is batch 2 inside
``denoiser``; ``--target device`` is the form upstream's on-device runtime
runs (the text encoders' ids cross as fp32).  Beside it go the pipeline's tokenizers (a folder each) and
its ``scheduler_config.json`` (``--scheduler NAME`` writes one of the
schedulers the loop steps instead, built from the same config: SD 1.5's PNDM
is not one).  ``generate-image`` is the loop (diffusers' scheduler, the
initial latents drawn as diffusers draws them from ``--seed``).  ``--verify``
judges the image of a fixed prompt against the family's diffusers pipeline
on the fp32 parts at the same seed, scheduler and 4 steps.  Nothing is
downloaded.  Needs the diffusers extra.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner import _compat
from coreai_partitioner.cli.command import CommandError
from coreai_partitioner.cli.detect import Detection
from coreai_partitioner.cli.task import Phases, Plan, partitioner_options

NAME = "text-to-image"
DETECT = Detection(takes="a diffusers Stable Diffusion pipeline directory (model_index.json)", files=("model_index.json",))
MODEL = "StableDiffusionPipeline"
RUNNER = "this package's generate-image loop (python -m coreai_partitioner generate-image)"
FLAGS = ("--quantize",)
DEFAULTS: dict[str, Any] = {}
#: ``--verify``'s run: a fixed prompt, seed, step count and guidance, against diffusers' pipeline.
VERIFY_PROMPT, VERIFY_SEED, VERIFY_STEPS, VERIFY_GUIDANCE = "a photograph of an astronaut riding a horse", 0, 4, 7.5
#: How close the .pte's image is to diffusers' (PSNR of the 8-bit images): the issue's bound in fp32; in fp16, a
#: floor under what software fp16 accumulating in fp16 gives here (docs/text-to-image.md).
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
    from coreai_partitioner.text_to_image.schedulers import SCHEDULERS  # the room imports ExecuTorch: not at detection

    parser.add_argument("--height", type=int, help="the image height in pixels (default: the pipeline's own)")
    parser.add_argument("--width", type=int, help="the image width in pixels (default: the pipeline's own)")
    parser.add_argument("--scheduler", choices=tuple(SCHEDULERS),
                        help="the scheduler written beside the .pte, built from the pipeline's config (default: the "
                             "pipeline's own; SD 1.x/2.x take ddim, euler, euler-ancestral, SD3 flow-match-euler)")


def refusals() -> tuple[type[Exception], ...]:
    from coreai_partitioner.text_to_image.pipeline import UnsupportedPipeline
    from coreai_partitioner.text_to_image.schedulers import UnsupportedScheduler

    return (UnsupportedPipeline, UnsupportedScheduler)


@dataclass
class ImagePlan(Plan):
    height: int = 0
    width: int = 0
    scheduler: dict[str, Any] | None = None  # the config written beside the .pte
    tokenizers: dict[str, Any] = field(default_factory=dict)  # by text encoder method


def settle(args: argparse.Namespace, config: Any) -> ImagePlan:
    """The resolution the pipeline can make, a scheduler the loop steps, the tokenizers."""
    from coreai_partitioner.text_to_image.schedulers import build_scheduler
    from coreai_partitioner.text_to_image.stable_diffusion import latent_size

    native = config.sample_size * config.vae_scale
    height, width = args.height or native, args.width or native
    latent_size(config, height, width)
    scheduler = dict(build_scheduler(config.scheduler, args.scheduler, config.family.schedulers).config)
    return ImagePlan(args, config, runner_tokenizer=False, height=height, width=width, scheduler=scheduler,
                     tokenizers=_tokenizers(args, config))


def _tokenizers(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """Each text encoder's tokenizer: the pipeline's folder, or the tiny pipeline's byte-level CLIP tokenizer."""
    from transformers import AutoTokenizer

    from coreai_partitioner.text_to_image.loop import TOKENIZERS

    if not args.checkpoint:
        from coreai_partitioner.text_to_image.tiny import tiny_tokenizers

        return tiny_tokenizers(config)
    found = {}
    for method in (method for method in TOKENIZERS if method in config.parts):
        folder = args.checkpoint / TOKENIZERS[method]
        try:
            found[method] = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError) as error:
            raise CommandError(f"{folder}: no tokenizer for {method} ({error}); the pipeline directory needs it") from None
    return found


def dry_run(plan: ImagePlan) -> None:
    config, args = plan.config, plan.args
    print(f"{config.class_name}: {plan.height}x{plan.width}, {args.dtype}, {args.target} form, "
          f"scheduler {plan.scheduler[_compat.DIFFUSERS_CLASS]}")
    shapes = _sample_shapes(config, plan.height, plan.width)
    for method, inputs in shapes.items():
        image = f" -> image [1, 3, {plan.height}, {plan.width}]" if method == "vae_decoder" else ""
        print(f"  {method}({', '.join(inputs)}){image}")
    print(f"  would write {args.out}, its tokenizers and scheduler_config.json")


def _sample_shapes(config: Any, height: int, width: int) -> dict[str, list[str]]:
    """Each method's inputs as ``name [shape]``, from the configs alone."""
    from coreai_partitioner.text_to_image.stable_diffusion import input_names, method_samples

    samples = method_samples(config, height, width, torch.float32)
    return {method: [f"{name} {list(sample.shape)}" for name, sample in zip(input_names(method, config), inputs)]
            for method, inputs in samples.items()}


# ---------------------------------------------------------------- export


def load_model(plan: ImagePlan, dtype: torch.dtype, *, reference: bool = False) -> torch.nn.Module:
    """The pipeline's parts at ``dtype`` (a tiny pipeline's made seeded in fp32, then cast)."""
    from coreai_partitioner.text_to_image.pipeline import load_parts
    from coreai_partitioner.text_to_image.tiny import tiny_model

    if plan.args.checkpoint:
        return load_parts(plan.config, dtype)
    return tiny_model(plan.config).to(dtype)


def reference(plan: ImagePlan, model: torch.nn.Module) -> torch.Tensor:
    """The family's diffusers pipeline on the fp32 parts: the 8-bit image ``[H, W, 3]`` of the fixed prompt."""
    from coreai_partitioner.text_to_image.reference import reference_image

    return reference_image(
        model, plan.tokenizers, plan.scheduler, VERIFY_PROMPT, seed=VERIFY_SEED, steps=VERIFY_STEPS,
        guidance=VERIFY_GUIDANCE, height=plan.height, width=plan.width,
    )


def lower(plan: ImagePlan, model: torch.nn.Module, phases: Phases) -> tuple[Any, Any]:
    """The three methods lowered; under ``--verify --quantize`` the quantized eager methods, the ``.pte``'s judge
    (``None`` otherwise: diffusers' pipeline is the reference)."""
    from coreai_partitioner.text_to_image import lower_stable_diffusion
    from coreai_partitioner.text_to_image.loop import EagerMethods
    from coreai_partitioner.text_to_image.stable_diffusion import constant_methods

    held: dict | None = {} if plan.args.verify and plan.args.quantize else None
    with phases("export and lower"):
        lowered = lower_stable_diffusion(
            model, height=plan.height, width=plan.width, device=plan.args.target == "device", quantize=plan.args.quantize,
            quantized_reference=held,
            **partitioner_options(plan.args),
        )
    return lowered, (EagerMethods(held, constant_methods(plan.config, plan.height, plan.width)) if held else None)


def eager(plan: ImagePlan, lowered: Any, lowered_from: Any, verified: Any) -> torch.Tensor:
    """The image the quantized eager methods draw through the same loop: what the ``.pte`` must draw."""
    return _verify_run(plan, lowered_from)


def _verify_run(plan: ImagePlan, program: Any) -> torch.Tensor:
    """``--verify``'s prompt, seed, steps and guidance through the loop on ``program`` (a ``.pte``'s or eager methods)."""
    from coreai_partitioner.text_to_image import generate

    return generate(
        program, VERIFY_PROMPT, seed=VERIFY_SEED, steps=VERIFY_STEPS, guidance=VERIFY_GUIDANCE,
        tokenizers=plan.tokenizers, scheduler_config=plan.scheduler,
    )


def describe(plan: ImagePlan, model: torch.nn.Module, pte: Any) -> None:
    print(f"{plan.config.class_name}: {plan.args.dtype}, {plan.args.target} form, {plan.height}x{plan.width}, "
          f"scheduler {plan.scheduler[_compat.DIFFUSERS_CLASS]}")
    print(f"  methods: {', '.join(pte.methods)}")
    for method in pte.methods:
        if not method.startswith("get_"):
            print(f"  {method}: {len(pte.coreai_delegates(method))} Core AI delegate(s)")


@dataclass(frozen=True)
class ImageReport:
    """The .pte's image against the reference's at the same prompt, seed, scheduler and steps: diffusers' pipeline,
    or for a quantized .pte its quantized eager methods (and diffusers' fp32 pipeline for the record)."""

    psnr_db: float
    least: float
    against: str = "the diffusers pipeline at the same seed"
    fp32_psnr_db: float | None = None  # a quantized .pte's image against diffusers' fp32 pipeline's

    @property
    def ok(self) -> bool:
        return self.psnr_db >= self.least

    def __str__(self) -> str:
        fp32 = "" if self.fp32_psnr_db is None else f"; against diffusers' fp32 pipeline {self.fp32_psnr_db:.1f} dB"
        return (
            f"verify: {VERIFY_PROMPT!r}, seed {VERIFY_SEED}, {VERIFY_STEPS} steps, guidance {VERIFY_GUIDANCE} through the "
            f".pte's methods against {self.against}, the check:\n"
            f"  PSNR {self.psnr_db:.1f} dB (at least {self.least:.0f}) {'ok' if self.ok else 'FAILED'}{fp32}"
        )


def check(plan: ImagePlan, path: Path, verified: torch.Tensor, eager: Any) -> ImageReport:
    from coreai_partitioner.text_to_image import ImageProgram
    from coreai_partitioner.text_to_image.reference import psnr

    image = _verify_run(plan, ImageProgram(path))
    least = LEAST_PSNR_DB[plan.args.dtype]
    if eager is None:
        return ImageReport(psnr(image, verified), least)
    against = f"its {plan.args.quantize} eager methods through the same loop"
    return ImageReport(psnr(image, eager), least, against, fp32_psnr_db=psnr(image, verified))


def companions(plan: ImagePlan, directory: Path) -> list[Path]:
    """A folder per tokenizer (``tokenizer/``, ``tokenizer_2/``...) and the scheduler's config, which
    ``generate-image`` reads beside the ``.pte``."""
    from coreai_partitioner.text_to_image.loop import TOKENIZERS
    from coreai_partitioner.text_to_image.pipeline import SCHEDULER_CONFIG

    written = []
    for method, tokenizer in plan.tokenizers.items():
        folder = directory / TOKENIZERS[method]
        tokenizer.save_pretrained(folder)
        written.append(folder)
    scheduler = directory / SCHEDULER_CONFIG
    scheduler.write_text(json.dumps(plan.scheduler, indent=2, default=list) + "\n")
    return [*written, scheduler]


def after(plan: ImagePlan) -> None:
    """Nothing: ``generate-image`` runs the .pte."""


# ---------------------------------------------------------------- generate-image


def add_generate_command(commands: Any) -> None:
    """``generate-image PTE --prompt ... [--seed N] [--steps K] [--guidance G] [--out image.png]``."""
    from coreai_partitioner.text_to_image.schedulers import SCHEDULERS

    parser = commands.add_parser("generate-image", help="run a text-to-image .pte (export's text-to-image task) and write a PNG")
    parser.add_argument("pte", type=Path)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--negative-prompt", default="")
    parser.add_argument("--seed", type=int, default=0,
                        help="the initial latents' seed: diffusers' image at generator=torch.Generator().manual_seed(SEED)")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--guidance", type=float, default=7.5, help="classifier-free guidance scale (at most 1: none)")
    parser.add_argument("--scheduler", choices=tuple(SCHEDULERS),
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
