"""Text-to-image: diffusers Stable Diffusion pipelines (SD 1.x/2.x, SD3 with and without T5) as the methods of one
``.pte``, run by the package's loop through ExecuTorch's runtime, against diffusers' own pipeline at the same seed."""

from __future__ import annotations

import json

import pytest
import torch
from requires import require

HEIGHT = WIDTH = 32  # the tiny pipelines' own resolution (sample_size 16, a VAE of scale 2)


def tiny(name: str = "stable-diffusion", without: tuple[str, ...] = ()):
    """The seeded tiny pipeline ``name``'s parts and tokenizers, leaving out the parts ``without`` names."""
    require("diffusers", "diffusers")
    from coreai_partitioner.text_to_image.tiny import tiny_config, tiny_model, tiny_tokenizers

    config = tiny_config(name)
    for folder in without:
        del config.parts[folder]
    return tiny_model(config), tiny_tokenizers(config)


def psnr(image, expected) -> float:
    from coreai_partitioner.text_to_image.reference import psnr

    return psnr(image, expected)


def assert_draws_diffusers_image(program, parts, tokenizers, runs):
    """Each ``(scheduler, seed, guidance)`` of ``runs``: the .pte's 4-step image is diffusers' (at least 40 dB)."""
    from coreai_partitioner.text_to_image import generate
    from coreai_partitioner.text_to_image.reference import reference_image

    config = parts.pipeline_config.scheduler
    for scheduler, seed, guidance in runs:
        expected = reference_image(parts, tokenizers, config, "a red cat", seed=seed, steps=4, guidance=guidance,
                                   height=HEIGHT, width=WIDTH, scheduler=scheduler)
        image = generate(program, "a red cat", seed=seed, steps=4, guidance=guidance, scheduler=scheduler,
                         tokenizers=tokenizers, scheduler_config=config)
        assert image.shape == (HEIGHT, WIDTH, 3) and image.float().std() > 10  # a picture, not one colour
        assert psnr(image, expected) >= 40, (scheduler, guidance, psnr(image, expected))
    return image


def one_delegate_each(edge, text_encoders):
    """Every method one delegate, nothing outside it (the text encoders take their ids as fp32)."""
    from coreai_partitioner.verify.describe import outside_delegates

    methods = ["denoiser", "vae_decoder", *text_encoders]
    assert outside_delegates(edge) == {method: {} for method in methods}
    for method in methods:
        delegates = [n for n in edge.exported_program(method).graph.nodes if "call_delegate" in str(n.target)]
        assert len(delegates) == 1, method


@pytest.mark.slow
def test_the_pte_draws_diffusers_image_at_the_same_seed_for_each_scheduler_and_guidance(tmp_path):
    from coreai_partitioner import save_pte
    from coreai_partitioner.text_to_image import ImageProgram, generate, lower_stable_diffusion

    parts, tokenizers = tiny()
    edge = lower_stable_diffusion(parts, height=HEIGHT, width=WIDTH)
    one_delegate_each(edge, ["text_encoder"])
    program = ImageProgram(save_pte(edge, tmp_path / "sd.pte"))
    image = assert_draws_diffusers_image(
        program, parts, tokenizers, [("euler", 3, 7.5), ("ddim", 5, 7.5), ("euler-ancestral", 7, 7.5), ("euler", 3, 1.0)]
    )
    other = generate(program, "a red cat", seed=4, steps=4, guidance=1.0, tokenizers=tokenizers,
                     scheduler_config=parts.pipeline_config.scheduler)
    assert psnr(other, image) < 40  # another seed, another image


@pytest.mark.slow
@pytest.mark.parametrize("without", [(), ("text_encoder_3",)], ids=["with-t5", "without-t5"])
def test_an_sd3_pte_draws_diffusers_image_at_the_same_seed(tmp_path, without):
    from coreai_partitioner import save_pte
    from coreai_partitioner.text_to_image import ImageProgram, lower_stable_diffusion

    parts, tokenizers = tiny("stable-diffusion-3", without)
    edge = lower_stable_diffusion(parts, height=HEIGHT, width=WIDTH)
    one_delegate_each(edge, [name for name in ("text_encoder", "text_encoder_2", "text_encoder_3") if name in parts.folders])
    program = ImageProgram(save_pte(edge, tmp_path / "sd3.pte"))
    assert_draws_diffusers_image(program, parts, tokenizers, [("flow-match-euler", 3, 7.0), ("flow-match-euler", 5, 1.0)])


@pytest.mark.slow
def test_the_device_form_keeps_upstreams_contract_and_draws_diffusers_image(tmp_path):
    from coreai_partitioner import save_pte
    from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte
    from coreai_partitioner.text_to_image import ImageProgram, lower_stable_diffusion
    from coreai_partitioner.verify.describe import outside_delegates

    parts, tokenizers = tiny("stable-diffusion-3")
    edge = lower_stable_diffusion(parts, height=HEIGHT, width=WIDTH, device=True)  # checks every delegate's inputs
    assert all(not outside for outside in outside_delegates(edge).values())
    pte = save_pte(edge, tmp_path / "sd3.pte")
    assert {d.backend_id for method in read_pte(pte).methods for d in read_pte(pte).coreai_delegates(method)} == {"CoreAIBackend"}
    assert_draws_diffusers_image(ImageProgram(pte), parts, tokenizers, [("flow-match-euler", 3, 7.0)])


def save_pipeline(directory, name: str = "stable-diffusion", scheduler_class: str | None = "PNDMScheduler"):
    """The tiny pipeline as ``DiffusionPipeline.save_pretrained`` writes it (by default with SD 1.5's PNDM)."""
    import diffusers

    from coreai_partitioner.text_to_image.reference import diffusers_pipeline

    parts, tokenizers = tiny(name)
    config = parts.pipeline_config.scheduler
    scheduler = getattr(diffusers, scheduler_class or config["_class_name"]).from_config(config)
    diffusers_pipeline(parts, tokenizers, scheduler).save_pretrained(directory)
    return parts, tokenizers


@pytest.mark.slow
def test_export_of_a_pipeline_directory_writes_a_pte_whose_generate_image_png_is_diffusers_image(tmp_path, capsys):
    import numpy
    from PIL import Image

    from coreai_partitioner.cli.main import main
    from coreai_partitioner.text_to_image.reference import reference_image

    parts, tokenizers = save_pipeline(tmp_path / "pipeline")
    out = tmp_path / "out" / "model.pte"
    # SD 1.5's PNDM is not a scheduler the loop steps: refused before any work, naming the flag that picks one
    with pytest.raises(SystemExit):
        main(["export", "--checkpoint", str(tmp_path / "pipeline"), "--out", str(out)])
    error = capsys.readouterr().err
    assert "PNDMScheduler" in error and "--scheduler" in error and not out.parent.exists()
    assert main(["export", "--checkpoint", str(tmp_path / "pipeline"), "--scheduler", "ddim", "--verify", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "denoiser: 1 Core AI delegate(s)" in printed and " ok" in printed
    assert json.loads((out.parent / "scheduler_config.json").read_text())["_class_name"] == "DDIMScheduler"
    png = tmp_path / "cat.png"
    assert main(["generate-image", str(out), "--prompt", "a red cat", "--seed", "2", "--steps", "4", "--out", str(png)]) == 0
    assert capsys.readouterr().err == ""  # the runtime's own lines are held
    image = torch.from_numpy(numpy.asarray(Image.open(png).convert("RGB")).copy())
    config = json.loads((tmp_path / "pipeline" / "scheduler" / "scheduler_config.json").read_text())
    expected = reference_image(parts, tokenizers, config, "a red cat", seed=2, steps=4, guidance=7.5, height=HEIGHT,
                               width=WIDTH, scheduler="ddim")
    assert psnr(image, expected) >= 40


@pytest.mark.slow
def test_palettize4_of_an_sd3_pipeline_draws_its_quantized_eager_image_at_most_035x_the_fp16_weights(tmp_path, capsys):
    from coreai_partitioner.cli.main import main
    from coreai_partitioner.text_to_image.stable_diffusion import method_modules

    parts, _ = save_pipeline(tmp_path / "pipeline", "stable-diffusion-3", scheduler_class=None)
    out = tmp_path / "model.pte"
    assert main(["export", "--checkpoint", str(tmp_path / "pipeline"), "--quantize", "palettize4", "--verify",
                 "--out", str(out)]) == 0
    said = capsys.readouterr()
    assert "kept float: transformer.proj_out" in said.err  # 16 output channels: not a multiple of a palette's 32 rows
    assert "against its palettize4 eager methods" in said.out and " ok;" in said.out
    assert {p.name for p in out.parent.iterdir()} >= {"tokenizer", "tokenizer_2", "tokenizer_3", "scheduler_config.json"}
    shipped = {id(p): p for module in method_modules(parts).values() for p in module.parameters()}
    fp16_bytes = 2 * sum(p.numel() for p in shipped.values())
    assert out.stat().st_size <= 0.35 * fp16_bytes, out.stat().st_size / fp16_bytes


def test_sd3s_pooled_text_encoder_gives_transformers_pooled_projection_without_a_gather():
    parts, tokenizers = tiny("stable-diffusion-3")
    from coreai_partitioner.text_to_image.stable_diffusion import PooledTextEncoder

    encoder = parts.text_encoder
    for eos in (encoder.config.eos_token_id, 2):  # the first end-of-text id; a legacy config's first largest id
        encoder.config.eos_token_id = encoder.text_model.eos_token_id = eos
        ids = torch.tensor([[512, 70, 71, 513, 513, 9, 2, 513]])
        with torch.no_grad():
            expected = encoder(input_ids=ids, output_hidden_states=True)
            hidden, pooled = PooledTextEncoder(encoder)(ids.to(torch.int32))  # as FloatIds hands it the ids
        assert torch.equal(hidden, expected.hidden_states[-2]) and torch.equal(pooled, expected.text_embeds), eos


def test_sd3s_t5_encoder_with_constant_buckets_gives_transformers_last_hidden_state():
    parts, tokenizers = tiny("stable-diffusion-3")
    from coreai_partitioner.text_to_image.stable_diffusion import T5_LENGTH, T5TextEncoder

    ids = tokenizers["text_encoder_3"]("a red cat", padding="max_length", max_length=T5_LENGTH, return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(T5TextEncoder(parts.text_encoder_3, T5_LENGTH)(ids), parts.text_encoder_3(ids).last_hidden_state)


def test_a_dry_run_names_the_methods_at_the_resolution_without_lowering(tmp_path, capsys):
    require("diffusers", "diffusers")
    from coreai_partitioner.cli.main import main

    assert main(["export", "--config", "stable-diffusion", "--height", "64", "--width", "48", "--dry-run",
                 "--out", str(tmp_path / "m.pte")]) == 0
    printed = capsys.readouterr().out
    assert "denoiser(latents [1, 4, 32, 24], timestep [1], text [2, 77, 32], guidance [1])" in printed
    assert "vae_decoder(latents [1, 4, 32, 24]) -> image [1, 3, 64, 48]" in printed and not (tmp_path / "m.pte").exists()
    assert main(["export", "--config", "stable-diffusion-3", "--dry-run", "--out", str(tmp_path / "m.pte")]) == 0
    printed = capsys.readouterr().out
    assert "text_encoder_3(input_ids [1, 256])" in printed
    assert "denoiser(latents [1, 4, 16, 16], timestep [1], text [2, 333, 64], pooled [2, 64], guidance [1])" in printed


def test_a_resolution_a_scheduler_and_a_pipeline_it_cannot_take_are_refused_naming_flag_and_field(tmp_path, capsys):
    require("diffusers", "diffusers")
    from coreai_partitioner.cli import detect
    from coreai_partitioner.cli.main import main

    with pytest.raises(SystemExit):
        main(["export", "--config", "stable-diffusion", "--height", "30", "--dry-run"])
    assert "--height 30 --width 32" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # SD3 is flow matching: a noise-prediction scheduler is not its
        main(["export", "--config", "stable-diffusion-3", "--scheduler", "euler", "--dry-run"])
    assert "FlowMatchEulerDiscreteScheduler for this pipeline" in capsys.readouterr().err
    pipeline = tmp_path / "sdxl"
    pipeline.mkdir()
    (pipeline / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLPipeline"}))
    assert detect.checkpoint_task(pipeline) == "text-to-image"  # model_index.json, no config.json
    with pytest.raises(SystemExit):
        main(["export", "--checkpoint", str(pipeline), "--dry-run"])
    assert "class 'StableDiffusionXLPipeline'; text-to-image exports" in capsys.readouterr().err
