"""A Stable Diffusion pipeline as the methods of one ``.pte``: its text encoders, ``denoiser`` and ``vae_decoder``.

SD 1.x/2.x (:data:`~.pipeline.STABLE_DIFFUSION`):

- :class:`TextEncoder`, ``text_encoder(input_ids [1, L]) -> hidden states
  [1, L, D]``: CLIP's last hidden state, what diffusers' pipeline conditions on;
- :class:`Denoiser`, ``denoiser(latents [1, C, h, w], timestep [1] (fp32),
  text [2, L, D], guidance [1]) -> noise [1, C, h, w]``.

SD3-class MMDiT (:data:`~.pipeline.STABLE_DIFFUSION_3`):

- :class:`PooledTextEncoder`, ``text_encoder`` and ``text_encoder_2``
  (``input_ids [1, 77] -> (penultimate hidden states [1, 77, D], pooled
  projection [1, P])``, as ``StableDiffusion3Pipeline._get_clip_prompt_embeds``
  reads them), and ``text_encoder_3`` where the pipeline has its T5
  (:class:`T5TextEncoder`: ``[1, 256] -> [1, 256, J]``);
- :class:`MMDiTDenoiser`, ``denoiser(latents, timestep [1] (fp32), text [2, 77 + 256, J],
  pooled [2, P1 + P2], guidance [1]) -> velocity``.

Each denoiser runs its network once at batch 2 on the latents twice, against
the negative prompt's conditioning (row 0) and the prompt's (row 1), combined
with classifier-free guidance as diffusers combines them.  Batch 2 inside one
call (as apple/ml-stable-diffusion's UNet takes it), not two calls: the
weights are read once a step, one delegate runs, and the loop makes half the
calls.  :class:`VaeDecoder`, ``vae_decoder(latents) -> image [1, 3, H, W]``:
the latents over the VAE's scaling factor (plus SD3's shift) decoded, and
mapped to ``[0, 1]`` as diffusers' image processor maps them.  The resolution
is fixed when the program is made (``H = h * vae_scale``).  The loop between
them is :mod:`.loop`.

Every text encoder takes its ids as fp32 (exact below 2**24, past any
vocabulary here), cast to int32 inside its delegate for the gathers
(:class:`FloatIds`): Core AI carries no int64, so int64 ids would leave a
cast outside the delegate, and upstream's on-device runtime passes fp16/fp32
tensors only.  So the device form (``device=True``) is the same methods,
relabelled and held to that runtime's contract: every input is fp16/fp32 of
static shape, and no method has state; nothing is outside a delegate in
either form.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coreai_partitioner.text_to_image.pipeline import STABLE_DIFFUSION, Parts, PipelineConfig, UnsupportedPipeline

#: The methods every ``.pte`` of the task has (SD3 adds ``text_encoder_2`` and, with T5, ``text_encoder_3``).
METHODS = ("text_encoder", "denoiser", "vae_decoder")
#: The T5 encoder's length in SD3 (``max_sequence_length``'s default in ``StableDiffusion3Pipeline``).
T5_LENGTH = 256


class TextEncoder(nn.Module):
    """CLIP's text encoder to its last hidden state (SD 1.x/2.x's conditioning)."""

    def __init__(self, text_encoder: nn.Module) -> None:
        super().__init__()
        self.text_encoder = text_encoder

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.text_encoder(input_ids=input_ids).last_hidden_state


class PooledTextEncoder(nn.Module):
    """A ``CLIPTextModelWithProjection`` to its penultimate hidden state and its pooled projection (SD3's).

    CLIP pools the final state at the first end-of-text token, which transformers finds with ``argmax`` and gathers
    by that int64 index: a Core AI delegate carries neither, so both would stay outside it.  Here the token is a
    one-hot mask over the positions and the pool a masked sum: the same numbers (one row and zeros added).
    """

    def __init__(self, text_encoder: nn.Module) -> None:
        super().__init__()
        self.text_encoder = text_encoder
        self.eos_token_id = int(text_encoder.config.eos_token_id)

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.text_encoder.text_model(input_ids=input_ids, output_hidden_states=True)
        last = out.last_hidden_state
        # transformers' CLIPTextTransformer: the first end-of-text id, or (a legacy config whose eos_token_id is 2)
        # the first largest id; argmax of none found is position 0
        found = input_ids == (input_ids.max(-1, keepdim=True).values if self.eos_token_id == 2 else self.eos_token_id)
        found = found.to(last.dtype)
        first = found * (torch.cumsum(found, -1) == 1).to(last.dtype)
        nowhere = 1 - found.amax(-1, keepdim=True)
        first = first + nowhere * (torch.arange(first.shape[-1]) == 0).to(last.dtype)
        pooled = (first.unsqueeze(-1) * last).sum(1)
        return out.hidden_states[-2], self.text_encoder.text_projection(pooled)


class T5TextEncoder(nn.Module):
    """A ``T5EncoderModel`` to its last hidden state at a fixed length (SD3's ``text_encoder_3``), its blocks over
    transformers' own modules, the relative position bias made from a constant table of buckets.

    transformers computes each bucket from ``arange``'s int64 positions (a ``log``, ``where`` and ``minimum``) and
    looks the bias up by them: int64 work a Core AI delegate does not carry, which would stay outside with the bias's
    weight.  At a fixed length ``T`` the buckets are constants: one per relative position, ``-(T - 1)`` to ``T - 1``,
    computed here once by transformers' own ``_relative_position_bucket`` (``2T - 1`` int32s, not ``T * T``).  The
    graph looks their bias up inside the delegate and lays it out ``[heads, T, T]`` (:func:`toeplitz`), and hands it
    to every block as ``T5Stack`` does.  The same numbers.
    """

    def __init__(self, encoder: nn.Module, length: int) -> None:
        from coreai_partitioner import _compat

        super().__init__()
        self.stack = encoder.encoder
        self.length = length
        relative = torch.arange(-(length - 1), length)
        buckets = _compat.t5_relative_position_bucket(self._attention(), relative, bidirectional=True)
        self.register_buffer("buckets", buckets.to(torch.int32), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.stack.embed_tokens(input_ids)
        bias = nn.functional.embedding(self.buckets, self._attention().relative_attention_bias.weight)  # [2T - 1, heads]
        bias = toeplitz(bias.t(), self.length).unsqueeze(0).to(hidden.dtype)
        for block in self.stack.block:
            hidden = block(hidden, position_bias=bias)[0]
        return self.stack.final_layer_norm(hidden)

    def _attention(self) -> nn.Module:
        """The first block's self-attention, which holds the bias every block adds (not a second name of it: a
        weight stored compressed is found by its one name)."""
        return self.stack.block[0].layer[0].SelfAttention


def toeplitz(values: torch.Tensor, length: int) -> torch.Tensor:
    """``[..., T, T]`` whose ``[i, j]`` is ``values[..., j - i + T - 1]``, from ``values`` ``[..., 2T - 1]`` (a value
    per relative position): each row the values repeated, a zero column appended, read again with a row one value
    shorter, which shifts each row one place (the "skew" of relative attention).  Reshapes and slices only, which a
    Core AI delegate takes where ``unfold`` or a gather by a ``T * T`` table of indices would not or would weigh."""
    width = 2 * length - 1
    rows = nn.functional.pad(values.unsqueeze(-2).expand(*values.shape[:-1], length, width), (0, 1))  # [..., T, 2T]
    flat = rows.reshape(*values.shape[:-1], 2 * length * length)
    return flat[..., length - 1 : length - 1 + length * width].reshape(*values.shape[:-1], length, width)[..., :length]


class FloatIds(nn.Module):
    """A text encoder method: its ids taken as fp32 and cast to int32 inside the delegate, for the embedding and the
    end-of-text mask (the module's docstring says why)."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor) -> Any:
        return self.encoder(input_ids.to(torch.int32))


class Denoiser(nn.Module):
    """The UNet at batch 2 (negative prompt, prompt) and classifier-free guidance: one step's noise prediction."""

    def __init__(self, unet: nn.Module) -> None:
        super().__init__()
        self.unet = unet

    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor, guidance: torch.Tensor):
        noise = self.unet(torch.cat([latents, latents]), timestep, encoder_hidden_states=text, return_dict=False)[0]
        return guided(noise, guidance)


class MMDiTDenoiser(nn.Module):
    """The ``SD3Transformer2DModel`` at batch 2 (negative prompt, prompt) and classifier-free guidance."""

    def __init__(self, transformer: nn.Module) -> None:
        super().__init__()
        self.transformer = transformer

    def forward(self, latents, timestep, text, pooled, guidance):
        velocity = self.transformer(
            hidden_states=torch.cat([latents, latents]), timestep=timestep.expand(2), encoder_hidden_states=text,
            pooled_projections=pooled, return_dict=False,
        )[0]
        return guided(velocity, guidance)


def guided(prediction: torch.Tensor, guidance: torch.Tensor) -> torch.Tensor:
    """diffusers' classifier-free guidance of a batch-2 prediction (negative prompt's, prompt's)."""
    unconditional, conditional = prediction.chunk(2)
    return unconditional + guidance * (conditional - unconditional)


class VaeDecoder(nn.Module):
    """The VAE's decoder on latents over its scaling factor plus its shift, the image mapped from ``[-1, 1]`` to
    ``[0, 1]``."""

    def __init__(self, vae: nn.Module, scaling_factor: float, shift_factor: float) -> None:
        super().__init__()
        self.vae = vae
        self.scaling_factor, self.shift_factor = scaling_factor, shift_factor

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        latents = latents / self.scaling_factor
        if self.shift_factor:
            latents = latents + self.shift_factor
        image = self.vae.decode(latents, return_dict=False)[0]
        return (image * 0.5 + 0.5).clamp(0, 1).contiguous()  # laid out as it is read (the device form's contract)


def latent_size(config: PipelineConfig, height: int, width: int) -> tuple[int, int]:
    """The latents' ``(h, w)`` for an image of ``height`` x ``width``; refused where the pipeline cannot make that
    size."""
    scale = config.vae_scale
    if config.family is STABLE_DIFFUSION:
        # the UNet halves the latents once per down block but the last, and must meet them again going up
        multiple, why = scale * 2 ** (len(config.denoiser["down_block_types"]) - 1), "its UNet's downsampling"
    else:
        multiple, why = scale * int(config.denoiser.get("patch_size", 2)), "its transformer's patch size"
    if height < multiple or width < multiple or height % multiple or width % multiple:
        raise UnsupportedPipeline(
            f"--height {height} --width {width}: this pipeline makes images whose sides are multiples of {multiple} "
            f"(its VAE's scale {scale} times {why})"
        )
    return height // scale, width // scale


def method_modules(parts: Parts) -> dict[str, nn.Module]:
    """The family's methods over ``parts``, the same in both forms."""
    config = parts.pipeline_config
    decoder = VaeDecoder(parts.vae, config.scaling_factor, config.shift_factor).eval()
    if config.family is STABLE_DIFFUSION:
        encoders = {"text_encoder": TextEncoder(parts.text_encoder)}
        denoiser = Denoiser(parts.unet)
    else:
        encoders = {"text_encoder": PooledTextEncoder(parts.text_encoder),
                    "text_encoder_2": PooledTextEncoder(parts.text_encoder_2)}
        if "text_encoder_3" in parts.folders:
            encoders["text_encoder_3"] = T5TextEncoder(parts.text_encoder_3, T5_LENGTH)
        denoiser = MMDiTDenoiser(parts.transformer)
    encoders = {name: FloatIds(encoder).eval() for name, encoder in encoders.items()}
    return {**encoders, "denoiser": denoiser.eval(), "vae_decoder": decoder}


def text_length(config: PipelineConfig) -> int:
    """The length of the conditioning the denoiser takes: CLIP's 77 (and T5's 256 after it, in SD3)."""
    length = config.text_encoder.max_position_embeddings
    return length if config.family is STABLE_DIFFUSION else length + T5_LENGTH


#: Each method's inputs by name, in order (the text encoders take ``input_ids``).
INPUTS = {
    "denoiser": ("latents", "timestep", "text", "guidance"),
    "denoiser-mmdit": ("latents", "timestep", "text", "pooled", "guidance"),
    "vae_decoder": ("latents",),
}


def input_names(method: str, config: PipelineConfig) -> tuple[str, ...]:
    if method == "denoiser" and config.family is not STABLE_DIFFUSION:
        return INPUTS["denoiser-mmdit"]
    return INPUTS.get(method, ("input_ids",))


def method_samples(config: PipelineConfig, height: int, width: int, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, ...]]:
    """Each method's sample inputs at ``height`` x ``width``, floating ones in ``dtype`` (the timestep fp32)."""
    h, w = latent_size(config, height, width)
    clip = config.text_encoder
    latents = torch.zeros(1, config.latent_channels, h, w, dtype=dtype)
    ids = torch.zeros(1, clip.max_position_embeddings)  # fp32 ids (FloatIds)
    guidance = torch.ones(1, dtype=dtype)
    if config.family is STABLE_DIFFUSION:
        text = torch.zeros(2, clip.max_position_embeddings, clip.hidden_size, dtype=dtype)
        return {"text_encoder": (ids,), "denoiser": (latents, torch.ones(1), text, guidance), "vae_decoder": (latents,)}
    denoiser = config.denoiser
    text = torch.zeros(2, text_length(config), denoiser["joint_attention_dim"], dtype=dtype)
    pooled = torch.zeros(2, denoiser["pooled_projection_dim"], dtype=dtype)
    samples = {"text_encoder": (ids,), "text_encoder_2": (ids,)}
    if "text_encoder_3" in config.parts:
        samples["text_encoder_3"] = (torch.zeros(1, T5_LENGTH),)
    return {**samples, "denoiser": (latents, torch.ones(1), text, pooled, guidance), "vae_decoder": (latents,)}


def constant_methods(config: PipelineConfig, height: int, width: int) -> dict[str, int]:
    """What the loop reads off the ``.pte``: ``get_family`` (1: SD 1.x/2.x, 3: SD3), ``get_height``, ``get_width``,
    ``get_latent_channels``, ``get_vae_scale``, ``get_max_text_len`` (the CLIP ids' length ``L``), ``get_text_dim``
    (the width of the denoiser's conditioning), and SD3's ``get_patch_size``."""
    denoiser = config.denoiser
    patch = {} if config.family is STABLE_DIFFUSION else {"get_patch_size": int(denoiser.get("patch_size", 2))}
    return {**patch,
        "get_family": config.family.code,
        "get_height": height,
        "get_width": width,
        "get_latent_channels": config.latent_channels,
        "get_vae_scale": config.vae_scale,
        "get_max_text_len": config.text_encoder.max_position_embeddings,
        "get_text_dim": int(denoiser.get("joint_attention_dim") or config.text_encoder.hidden_size),
    }


def lower_stable_diffusion(
    parts: Parts, *, height: int, width: int, device: bool = False, quantize: Any = None,
    quantized_reference: dict | None = None, **partitioner_options: Any,
):
    """The family's methods lowered to one ``.pte`` (one asset: each weight stored once,
    :func:`~coreai_partitioner.lowering.methods.lower_method_modules`) at ``height`` x ``width``, in the host form
    or (``device``) the form upstream's on-device runtime runs, its delegates checked against that runtime's
    contract; the weights stored as
    ``quantize`` (a scheme of :data:`coreai_partitioner.quantize.SCHEMES`, or ``None``) says (``quantized_reference``,
    a dict, receives each method's quantized eager module); the ``EdgeProgramManager``, with
    :func:`constant_methods`.
    """
    from coreai_partitioner.lowering.methods import lower_method_modules

    return lower_method_modules(
        method_modules(parts), method_samples(parts.pipeline_config, height, width, next(parts.vae.parameters()).dtype),
        device=device,
        constant_methods=constant_methods(parts.pipeline_config, height, width), quantize=quantize,
        quantized_reference=quantized_reference, **partitioner_options,
    )
