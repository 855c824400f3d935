"""Tiny random text-to-image pipelines: ``--config stable-diffusion`` (SD 1.x's parts at a few channels, two layers
each, SD's Euler scheduler) and ``--config stable-diffusion-3`` (SD3's two CLIP encoders with projections, a T5
encoder and an MMDiT of two layers each, the flow-matching Euler scheduler); CLIP tokenizers over single bytes, a T5
tokenizer over single characters (:func:`tiny_tokenizers`)."""

from __future__ import annotations

from typing import Any

from coreai_partitioner import _compat
from coreai_partitioner.text_to_image.pipeline import PipelineConfig

#: ``--config`` names of the tiny random text-to-image pipelines, and the pipeline class each is.
NAMES = {"stable-diffusion": "StableDiffusionPipeline", "stable-diffusion-3": "StableDiffusion3Pipeline"}
#: SD 1.x's scheduler settings (its ``scheduler_config.json``), with its Euler scheduler.
SCHEDULER = {
    _compat.DIFFUSERS_CLASS: "EulerDiscreteScheduler", "beta_start": 0.00085, "beta_end": 0.012,
    "beta_schedule": "scaled_linear", "num_train_timesteps": 1000, "prediction_type": "epsilon", "steps_offset": 1,
    "timestep_spacing": "leading", "clip_sample": False, "set_alpha_to_one": False,
}
#: SD3's scheduler settings.
SD3_SCHEDULER = {_compat.DIFFUSERS_CLASS: "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0}
#: Two VAE blocks of 32 and 64 channels (a scale of 2); its other fields at AutoencoderKL's defaults.
VAE = dict(
    block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
    down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=32,
)


def tiny_config(name: str = "stable-diffusion") -> PipelineConfig:
    if name not in NAMES:
        raise ValueError(f"no tiny text-to-image config {name!r}; choose one of {', '.join(NAMES)}")
    if name == "stable-diffusion-3":
        return _sd3_config()
    unet = dict(  # UNet2DConditionModel's config: its other fields at their defaults
        block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=32,
    )
    parts = {"text_encoder": _clip_config(), "unet": unet, "vae": dict(VAE)}
    return PipelineConfig(NAMES[name], parts, dict(SCHEDULER))


def _clip_config(**extra: Any) -> Any:
    from transformers import CLIPTextConfig

    tokenizer = tiny_tokenizer()
    return CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2,
        max_position_embeddings=77, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **extra,
    )


def _sd3_config() -> PipelineConfig:
    transformer = dict(  # SD3Transformer2DModel's
        sample_size=16, patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8,
        num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=64, pooled_projection_dim=64,
        pos_embed_max_size=16,
    )
    vae = dict(VAE, shift_factor=0.0609, scaling_factor=1.5035, use_quant_conv=False, use_post_quant_conv=False)
    from transformers import T5Config

    t5 = T5Config(vocab_size=len(tiny_t5_tokenizer()), d_model=64, d_kv=16, d_ff=64, num_layers=2, num_heads=4,
                  relative_attention_num_buckets=8, feed_forward_proj="gated-gelu")
    parts = {"text_encoder": _clip_config(projection_dim=32), "text_encoder_2": _clip_config(projection_dim=32),
             "text_encoder_3": t5, "transformer": transformer, "vae": vae}
    return PipelineConfig(NAMES["stable-diffusion-3"], parts, dict(SD3_SCHEDULER))


def tiny_model(config: PipelineConfig) -> Any:
    """The seeded tiny pipeline's parts in fp32."""
    import diffusers
    import torch
    import transformers

    from coreai_partitioner.text_to_image.pipeline import Parts

    torch.manual_seed(0)
    modules = {}
    for folder, part in config.parts.items():
        class_name = {**config.family.parts, **config.family.optional}[folder]
        if hasattr(transformers, class_name) and not isinstance(part, dict):
            modules[folder] = getattr(transformers, class_name)(part)
        else:
            modules[folder] = getattr(diffusers, class_name).from_config(part)
    return Parts(modules, config).eval()


def tiny_tokenizers(config: PipelineConfig) -> dict[str, Any]:
    """The tokenizer of each text encoder of a tiny pipeline, by its method."""
    return {method: tiny_t5_tokenizer() if method == "text_encoder_3" else tiny_tokenizer()
            for method in ("text_encoder", "text_encoder_2", "text_encoder_3") if method in config.parts}


def tiny_t5_tokenizer() -> Any:
    """A T5 tokenizer (SentencePiece's unigram) over single printable characters, with and without a word start."""
    import string

    from transformers import T5Tokenizer

    chars = [char for char in string.printable if not char.isspace()]
    pieces = ["<pad>", "</s>", "<unk>", "\u2581"] + chars + ["\u2581" + char for char in chars]
    return T5Tokenizer(vocab=[(piece, -1.0) for piece in pieces], extra_ids=0)


def tiny_tokenizer() -> Any:
    """A CLIP tokenizer whose vocabulary is CLIP's byte alphabet (each byte, and each byte ending a word), no merges:
    real CLIP tokenization, a token per character."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import CLIPTokenizer

    alphabet = sorted(ByteLevel.alphabet())
    tokens = alphabet + [f"{char}</w>" for char in alphabet] + ["<|startoftext|>", "<|endoftext|>"]
    return CLIPTokenizer(vocab={token: i for i, token in enumerate(tokens)}, merges=[], model_max_length=77)
