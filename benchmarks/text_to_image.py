"""Text-to-image export and runtime: Stable Diffusion pipelines (random weights) to a .pte of their text encoders,
``denoiser`` and ``vae_decoder``.

    python benchmarks/text_to_image.py                         # every row; writes benchmarks/results/text_to_image.*
    python benchmarks/text_to_image.py --rows sd-tiny-fp32 sd-tiny-palettize4
    python benchmarks/text_to_image.py --plot                  # the plot of the results file (needs the bench extra)

Each row is one process: build the pipeline's parts (the package's tiny
pipelines, SD 1.x's and SD3's with T5, or SD 1.5's shape: a CLIP ViT-L/14
text encoder, the 860M UNet, the VAE; random weights, as no trained
diffusion weights are in the registry; SD3's own shape, with its 4.7B T5,
does not fit this machine in fp32), lower them (``text_to_image.lower_stable_diffusion``), write the
``.pte``, then run the package's loop (``generate``) in ExecuTorch's runtime:
"s/step" is the median of ``--runs`` ``denoiser`` calls after a warm-up,
"image s" one whole 4-step image (text encoder twice, 4 steps, VAE decoder).
"PSNR dB" is that image against the family's diffusers pipeline on the fp32
parts at the same seed, scheduler (Euler; SD3's flow-matching Euler) and
steps.  ".pte/fp16" is
the ``.pte`` over the parts' weights it holds in fp16 (the VAE's encoder is not
in it).  The Core AI delegates run on coreai-core's Linux CPU runtime on this
2-core machine, whose fp16 is software: not on a device.
"""

from __future__ import annotations

import resource
import statistics
import tempfile
import time
from pathlib import Path

import row_benchmark

#: row -> (shape: a tiny config's name or "sd1.5", dtype, quantize scheme or None, image side)
ROWS = {
    "sd-tiny-fp32": ("stable-diffusion", "fp32", None, 32),
    "sd-tiny-fp16": ("stable-diffusion", "fp16", None, 32),
    "sd-tiny-palettize4": ("stable-diffusion", "fp32", "palettize4", 32),
    "sd-tiny-palettize8": ("stable-diffusion", "fp32", "palettize8", 32),
    "sd3-tiny-fp32": ("stable-diffusion-3", "fp32", None, 32),
    "sd3-tiny-fp16": ("stable-diffusion-3", "fp16", None, 32),
    "sd3-tiny-palettize4": ("stable-diffusion-3", "fp32", "palettize4", 32),
    "sd1.5-shape-fp32-128": ("sd1.5", "fp32", None, 128),
}
COLUMNS = ("row", "lower s", "write s", "peak RSS GB", ".pte MB", "fp16 weights MB", ".pte/fp16", "s/step", "image s",
           "PSNR dB")


def sd15_parts():
    """SD 1.5's shape: CLIP ViT-L/14's text encoder, the UNet and VAE of its configs; random weights."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from coreai_partitioner.text_to_image.pipeline import Parts, PipelineConfig
    from coreai_partitioner.text_to_image.tiny import SCHEDULER, tiny_tokenizer

    tokenizer = tiny_tokenizer()  # byte-level: its ids are a subset of CLIP's vocabulary
    text = CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                          num_hidden_layers=12, max_position_embeddings=77, hidden_act="quick_gelu",
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id)
    unet = dict(sample_size=64, cross_attention_dim=768, attention_head_dim=8)  # the rest: UNet2DConditionModel's defaults
    vae = dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4, sample_size=512,
               down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)
    torch.manual_seed(0)
    unet_model = UNet2DConditionModel.from_config(unet)
    config = PipelineConfig("StableDiffusionPipeline", {"text_encoder": text, "unet": dict(unet_model.config), "vae": vae},
                            dict(SCHEDULER))
    modules = {"text_encoder": CLIPTextModel(text), "unet": unet_model, "vae": AutoencoderKL.from_config(vae)}
    return Parts(modules, config).eval()


def worker(name: str, runs: int) -> dict:
    import torch

    from coreai_partitioner import save_pte
    from coreai_partitioner.text_to_image import ImageProgram, generate, lower_stable_diffusion
    from coreai_partitioner.text_to_image.reference import psnr, reference_image
    from coreai_partitioner.text_to_image.stable_diffusion import method_modules, method_samples
    from coreai_partitioner.text_to_image.tiny import tiny_config, tiny_model, tiny_tokenizers

    shape, dtype, scheme, side = ROWS[name]
    parts = sd15_parts() if shape == "sd1.5" else tiny_model(tiny_config(shape))
    shipped = {id(p): p for module in method_modules(parts).values() for p in module.parameters()}
    fp16_bytes = 2 * sum(p.numel() for p in shipped.values())
    tokenizers, config = tiny_tokenizers(parts.pipeline_config), parts.pipeline_config.scheduler
    expected = reference_image(parts, tokenizers, config, "a red cat", seed=0, steps=4, guidance=7.5, height=side, width=side)
    if dtype == "fp16":
        parts = parts.to(torch.float16)
    started = time.perf_counter()
    edge = lower_stable_diffusion(parts, height=side, width=side, quantize=scheme)
    lowered = time.perf_counter() - started
    samples = method_samples(parts.pipeline_config, side, side, next(parts.vae.parameters()).dtype)["denoiser"]
    del parts
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        pte = save_pte(edge, Path(directory) / "sd.pte")
        written = time.perf_counter() - started
        size = pte.stat().st_size
        del edge
        program = ImageProgram(pte)
        program.run("denoiser", *samples)  # warm-up
        seconds = []
        for _ in range(runs):
            started = time.perf_counter()
            program.run("denoiser", *samples)
            seconds.append(time.perf_counter() - started)
        started = time.perf_counter()
        image = generate(program, "a red cat", seed=0, steps=4, guidance=7.5, tokenizers=tokenizers, scheduler_config=config)
        whole = time.perf_counter() - started
    return {
        "row": name, "lower s": round(lowered, 1), "write s": round(written, 1),
        "peak RSS GB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        ".pte MB": round(size / 1e6, 2), "fp16 weights MB": round(fp16_bytes / 1e6, 2),
        ".pte/fp16": round(size / fp16_bytes, 3), "s/step": round(statistics.median(seconds), 3),
        "image s": round(whole, 2), "PSNR dB": round(psnr(image, expected), 1),
    }


def plot(rows: list[dict], path: Path) -> None:
    """The .pte against the fp16 weights, and seconds per denoising step, per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row["row"] for row in rows]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4))
    left.bar(names, [row[".pte/fp16"] for row in rows])
    left.axhline(0.35, color="red", linestyle="--", linewidth=1, label="0.35x: the palettize4 target")
    left.set_ylabel(".pte / the methods' weights in fp16")
    left.set_title(".pte size")
    left.legend(fontsize=7)
    right.bar(names, [row["s/step"] for row in rows])
    right.set_yscale("log")
    right.set_ylabel("s per denoising step")
    right.set_title("denoiser call, coreai-core Linux CPU runtime, 2 cores")
    for axis in (left, right):
        axis.tick_params(axis="x", labelrotation=45, labelsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    row_benchmark.main(__file__, __doc__, ROWS, COLUMNS, worker, "text_to_image", "random weights", plot=plot)
