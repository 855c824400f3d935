"""diffusers' own pipeline on a pipeline's parts: what the ``.pte``'s loop is judged against (``--verify``, the tests,
the benchmark)."""

from __future__ import annotations

from typing import Any

import torch

from coreai_partitioner.text_to_image.pipeline import STABLE_DIFFUSION, Parts


def diffusers_pipeline(parts: Parts, tokenizers: dict[str, Any], scheduler: Any) -> Any:
    """The family's diffusers pipeline over ``parts`` (no safety checker), ``tokenizers`` by text encoder method."""
    import diffusers

    if parts.pipeline_config.family is STABLE_DIFFUSION:
        pipeline = diffusers.StableDiffusionPipeline(
            vae=parts.vae, text_encoder=parts.text_encoder, tokenizer=tokenizers["text_encoder"], unet=parts.unet,
            scheduler=scheduler, safety_checker=None, feature_extractor=None, requires_safety_checker=False,
        )
    else:
        t5 = "text_encoder_3" in parts.folders
        pipeline = diffusers.StableDiffusion3Pipeline(
            transformer=parts.transformer, scheduler=scheduler, vae=parts.vae,
            text_encoder=parts.text_encoder, tokenizer=tokenizers["text_encoder"],
            text_encoder_2=parts.text_encoder_2, tokenizer_2=tokenizers["text_encoder_2"],
            text_encoder_3=parts.text_encoder_3 if t5 else None, tokenizer_3=tokenizers.get("text_encoder_3"),
        )
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def reference_image(
    parts: Parts, tokenizers: dict[str, Any], scheduler_config: dict[str, Any], prompt: str, *, seed: int, steps: int,
    guidance: float, height: int, width: int, scheduler: str | None = None,
) -> torch.Tensor:
    """diffusers' 8-bit image ``[H, W, 3]`` of ``prompt`` at ``generator=torch.Generator().manual_seed(seed)``, with
    the scheduler :func:`~.schedulers.build_scheduler` makes of ``scheduler_config`` (and ``scheduler``)."""
    from coreai_partitioner.text_to_image.schedulers import build_scheduler

    steps_with = build_scheduler(scheduler_config, scheduler, parts.pipeline_config.family.schedulers)
    pipeline = diffusers_pipeline(parts, tokenizers, steps_with)
    with torch.no_grad():
        image = pipeline(
            prompt, height=height, width=width, num_inference_steps=steps, guidance_scale=guidance,
            generator=torch.Generator().manual_seed(seed), output_type="np",
        ).images[0]
    return torch.from_numpy((image * 255).round().astype("uint8"))


def psnr(image: torch.Tensor, expected: torch.Tensor) -> float:
    """PSNR of two 8-bit images, in dB (infinite where they are equal)."""
    error = (image.double() - expected.double()).pow(2).mean()
    return float("inf") if error == 0 else float(10 * torch.log10(255.0**2 / error))
