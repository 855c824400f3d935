"""Text-to-image: a diffusers Stable Diffusion pipeline as ``text_encoder``, ``denoiser`` and ``vae_decoder`` in one
``.pte``, run by the package's loop through ExecuTorch's runtime, against diffusers' own pipeline at the same seed."""

from __future__ import annotations

import json

import pytest
import torch
from requires import require

HEIGHT = WIDTH = 32  # the tiny pipeline's own resolution (sample_size 16, a VAE of scale 2)


def tiny_parts():
    require("diffusers", "diffusers")
    from coreai_partitioner.text_to_image.tiny import tiny_config, tiny_model

    return tiny_model(tiny_config())


def diffusers_image(parts, scheduler, prompt: str, seed: int, steps: int, guidance: float) -> torch.Tensor:
    """``StableDiffusionPipeline`` itself on the parts: the 8-bit image ``[H, W, 3]``."""
    from diffusers import StableDiffusionPipeline

    from coreai_partitioner.text_to_image.tiny import tiny_tokenizer

    pipeline = StableDiffusionPipeline(
        vae=parts.vae, text_encoder=parts.text_encoder, tokenizer=tiny_tokenizer(), unet=parts.unet, scheduler=scheduler,
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )
    pipeline.set_progress_bar_config(disable=True)
    image = pipeline(prompt, height=HEIGHT, width=WIDTH, num_inference_steps=steps, guidance_scale=guidance,
                     generator=torch.Generator().manual_seed(seed), output_type="np").images[0]
    return torch.from_numpy((image * 255).round().astype("uint8"))


def psnr(image, expected) -> float:
    from coreai_partitioner.cli.tasks.text_to_image import psnr

    return psnr(image, expected)


@pytest.mark.slow
def test_the_pte_draws_diffusers_image_at_the_same_seed_for_each_scheduler_and_guidance(tmp_path):
    from coreai_partitioner import save_pte
    from coreai_partitioner.text_to_image import ImageProgram, generate, lower_stable_diffusion
    from coreai_partitioner.text_to_image.schedulers import build_scheduler
    from coreai_partitioner.text_to_image.tiny import tiny_tokenizer
    from coreai_partitioner.verify.describe import outside_delegates

    parts = tiny_parts()
    edge = lower_stable_diffusion(parts, height=HEIGHT, width=WIDTH)
    # each method one delegate; outside, only the int64 ids' cast for the text encoder (Core AI carries no int64)
    assert outside_delegates(edge) == {"text_encoder": {"aten._to_copy.default": 1}, "denoiser": {}, "vae_decoder": {}}
    for method in ("text_encoder", "denoiser", "vae_decoder"):
        delegates = [n for n in edge.exported_program(method).graph.nodes if "call_delegate" in str(n.target)]
        assert len(delegates) == 1, method
    program = ImageProgram(save_pte(edge, tmp_path / "sd.pte"))
    config = parts.pipeline_config.scheduler
    for scheduler, seed, guidance in (("euler", 3, 7.5), ("ddim", 5, 7.5), ("euler-ancestral", 7, 7.5), ("euler", 3, 1.0)):
        expected = diffusers_image(parts, build_scheduler(config, scheduler), "a red cat", seed, 4, guidance)
        image = generate(program, "a red cat", seed=seed, steps=4, guidance=guidance, scheduler=scheduler,
                         tokenizer=tiny_tokenizer(), scheduler_config=config)
        assert image.shape == (HEIGHT, WIDTH, 3) and image.float().std() > 10  # a picture, not one colour
        assert psnr(image, expected) >= 40, (scheduler, guidance, psnr(image, expected))
    # another seed, another image
    other = generate(program, "a red cat", seed=4, steps=4, tokenizer=tiny_tokenizer(), scheduler_config=config)
    assert psnr(other, image) < 40


def save_pipeline(directory, scheduler_class: str = "PNDMScheduler"):
    """The tiny pipeline as ``DiffusionPipeline.save_pretrained`` writes it, with SD 1.5's PNDM scheduler."""
    import diffusers

    from coreai_partitioner.text_to_image.tiny import SCHEDULER, tiny_tokenizer

    parts = tiny_parts()
    scheduler = getattr(diffusers, scheduler_class).from_config(SCHEDULER)
    diffusers.StableDiffusionPipeline(
        vae=parts.vae, text_encoder=parts.text_encoder, tokenizer=tiny_tokenizer(), unet=parts.unet, scheduler=scheduler,
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    ).save_pretrained(directory)
    return parts


@pytest.mark.slow
def test_export_of_a_pipeline_directory_writes_a_pte_whose_generate_image_png_is_diffusers_image(tmp_path, capsys):
    from PIL import Image

    from coreai_partitioner.cli.main import main
    from coreai_partitioner.text_to_image.schedulers import build_scheduler

    parts = save_pipeline(tmp_path / "pipeline")
    out = tmp_path / "out" / "model.pte"
    # SD 1.5's PNDM is not a scheduler the loop steps: refused before any work, naming the flag that picks one
    with pytest.raises(SystemExit):
        main(["export", "--checkpoint", str(tmp_path / "pipeline"), "--out", str(out)])
    error = capsys.readouterr().err
    assert "PNDMScheduler" in error and "--scheduler" in error and not out.parent.exists()
    assert main(["export", "--checkpoint", str(tmp_path / "pipeline"), "--scheduler", "ddim", "--verify", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "denoiser: 1 Core AI delegate(s)" in printed and "ok" in printed
    assert json.loads((out.parent / "scheduler_config.json").read_text())["_class_name"] == "DDIMScheduler"
    png = tmp_path / "cat.png"
    assert main(["generate-image", str(out), "--prompt", "a red cat", "--seed", "2", "--steps", "4", "--out", str(png)]) == 0
    assert capsys.readouterr().err == ""  # the runtime's own lines are held
    image = torch.from_numpy(__import__("numpy").asarray(Image.open(png).convert("RGB")).copy())
    config = json.loads((tmp_path / "pipeline" / "scheduler" / "scheduler_config.json").read_text())
    expected = diffusers_image(parts, build_scheduler(config, "ddim"), "a red cat", 2, 4, 7.5)
    assert psnr(image, expected) >= 40


@pytest.mark.slow
def test_palettize4_pte_draws_its_quantized_eager_image_at_most_035x_the_fp16_weights(tmp_path, capsys):
    from coreai_partitioner.cli.main import main
    from coreai_partitioner.text_to_image.stable_diffusion import method_modules

    out = tmp_path / "model.pte"
    assert main(["export", "--config", "stable-diffusion", "--quantize", "palettize4", "--verify", "--out", str(out)]) == 0
    said = capsys.readouterr()
    assert "kept float: unet.conv_out" in said.err  # its 4 output channels: not a multiple of a palette's 32 rows
    printed = said.out
    assert "against its palettize4 eager methods" in printed and "ok;" in printed
    shipped = {id(p): p for module in method_modules(tiny_parts()).values() for p in module.parameters()}
    fp16_bytes = 2 * sum(p.numel() for p in shipped.values())
    assert out.stat().st_size <= 0.35 * fp16_bytes, out.stat().st_size / fp16_bytes


def test_a_dry_run_names_the_three_methods_at_the_resolution_without_lowering(tmp_path, capsys):
    require("diffusers", "diffusers")
    from coreai_partitioner.cli.main import main

    assert main(["export", "--config", "stable-diffusion", "--height", "64", "--width", "48", "--dry-run",
                 "--out", str(tmp_path / "m.pte")]) == 0
    printed = capsys.readouterr().out
    assert "denoiser(latents [1, 4, 32, 24], timestep [1], text [2, 77, 32], guidance [1])" in printed
    assert "image [1, 3, 64, 48]" in printed and not (tmp_path / "m.pte").exists()


def test_a_resolution_the_pipeline_cannot_make_and_an_sd3_pipeline_are_refused_naming_flag_and_field(tmp_path, capsys):
    require("diffusers", "diffusers")
    from coreai_partitioner.cli import detect
    from coreai_partitioner.cli.main import main

    with pytest.raises(SystemExit):
        main(["export", "--config", "stable-diffusion", "--height", "30", "--dry-run"])
    assert "--height 30 --width 32" in capsys.readouterr().err
    pipeline = tmp_path / "sd3"
    pipeline.mkdir()
    (pipeline / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}))
    assert detect.checkpoint_task(pipeline) == "text-to-image"  # model_index.json, no config.json
    with pytest.raises(SystemExit):
        main(["export", "--checkpoint", str(pipeline), "--dry-run"])
    error = capsys.readouterr().err
    assert "_class_name 'StableDiffusion3Pipeline'" in error and "not exported yet" in error
