"""A tiny random Stable Diffusion pipeline (``--config stable-diffusion``): SD 1.x's parts at a few channels, two
layers each, with a CLIP tokenizer over single bytes and SD's Euler scheduler."""

from __future__ import annotations

from coreai_partitioner import _compat

from typing import Any

from coreai_partitioner.text_to_image.pipeline import PipelineConfig

#: ``--config`` names of the tiny random text-to-image pipelines.
NAMES = ("stable-diffusion",)
#: SD 1.x's scheduler settings (its ``scheduler_config.json``), with its Euler scheduler.
SCHEDULER = {
    _compat.DIFFUSERS_CLASS: "EulerDiscreteScheduler", "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000, "prediction_type": "epsilon", "steps_offset": 1, "timestep_spacing": "leading",
    "clip_sample": False, "set_alpha_to_one": False,
}


def tiny_config(name: str = "stable-diffusion") -> PipelineConfig:
    from transformers import CLIPTextConfig

    if name not in NAMES:
        raise ValueError(f"no tiny text-to-image config {name!r}; choose one of {', '.join(NAMES)}")
    tokenizer = tiny_tokenizer()
    text = CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2,
        max_position_embeddings=77, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    unet = dict(  # UNet2DConditionModel's config: its other fields at their defaults
        block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=32,
    )
    vae = dict(  # AutoencoderKL's
        block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=32,
    )
    return PipelineConfig("StableDiffusionPipeline", text, unet, vae, dict(SCHEDULER))


def tiny_model(config: PipelineConfig) -> Any:
    """The seeded tiny pipeline's parts in fp32."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel

    from coreai_partitioner.text_to_image.pipeline import Parts

    torch.manual_seed(0)
    text_encoder = CLIPTextModel(config.text_encoder)
    unet = UNet2DConditionModel.from_config(config.unet)
    vae = AutoencoderKL.from_config(config.vae)
    return Parts(text_encoder, unet, vae, config).eval()


def tiny_tokenizer() -> Any:
    """A CLIP tokenizer whose vocabulary is CLIP's byte alphabet (each byte, and each byte ending a word), no merges:
    real CLIP tokenization, a token per character."""
    from transformers import CLIPTokenizer
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    tokens = alphabet + [f"{char}</w>" for char in alphabet] + ["<|startoftext|>", "<|endoftext|>"]
    return CLIPTokenizer(vocab={token: i for i, token in enumerate(tokens)}, merges=[], model_max_length=77)
