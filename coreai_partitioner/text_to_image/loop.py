"""The text-to-image loop: a prompt through a ``.pte``'s methods and diffusers' scheduler to an image.

:func:`generate` follows the family's pipeline (``StableDiffusionPipeline.__call__``,
``StableDiffusion3Pipeline.__call__``) step by step: the prompt and the
negative prompt encoded as the pipeline encodes them (:func:`encode`), the
initial latents drawn from ``torch.Generator().manual_seed(seed)`` as
diffusers' ``randn_tensor`` draws them (scaled by the scheduler's initial
sigma for SD 1.x/2.x), each of the scheduler's timesteps a ``denoiser`` call
and a scheduler step (the generator handed to the steps that draw, as
diffusers hands it), then ``vae_decoder``.  The same seed, scheduler, step
count and guidance give diffusers' image.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.text_to_image.pipeline import SCHEDULER_CONFIG, STABLE_DIFFUSION, STABLE_DIFFUSION_3
from coreai_partitioner.text_to_image.stable_diffusion import METHODS, T5_LENGTH
from coreai_partitioner.verify.program import LoadedProgram

#: The tokenizer folders written beside the ``.pte``, by the text encoder method that reads their ids.
TOKENIZERS = {"text_encoder": "tokenizer", "text_encoder_2": "tokenizer_2", "text_encoder_3": "tokenizer_3"}


class ImageProgram(LoadedProgram):
    """A text-to-image ``.pte`` loaded in ExecuTorch's runtime, with the tokenizers and scheduler config written
    beside it."""

    METHODS = METHODS
    EXPORT = "a text-to-image pipeline (python -m coreai_partitioner export --checkpoint PIPELINE_DIR)"

    def run(self, method: str, *inputs: torch.Tensor) -> Any:
        """A method's one output, or its outputs as a tuple (as :class:`EagerMethods` gives them)."""
        outputs = super().run(method, *inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def tokenizers(self) -> dict[str, Any]:
        """The tokenizer of each text encoder method, from its folder beside the ``.pte``."""
        from transformers import AutoTokenizer

        found = {}
        for method, folder in TOKENIZERS.items():
            if not self.has(method):
                continue
            if not (self.path.parent / folder / "tokenizer_config.json").is_file():
                raise ValueError(f"{self.path.parent / folder}: no tokenizer for {method}: export the pipeline again, "
                                 f"which writes it beside {self.path.name}")
            found[method] = AutoTokenizer.from_pretrained(self.path.parent / folder)
        return found

    def scheduler_config(self) -> dict[str, Any]:
        """The pipeline's ``scheduler_config.json`` written beside the ``.pte``."""
        import json

        path = self.path.parent / SCHEDULER_CONFIG
        if not path.is_file():
            raise ValueError(f"{path}: missing: export the pipeline again, which writes it beside {self.path.name}")
        return json.loads(path.read_text())


class EagerMethods:
    """The methods as eager modules (a quantized program's ``module()`` each) and the constants, run by
    :func:`generate` as a ``.pte``'s are: the reference a quantized ``.pte`` is judged against."""

    def __init__(self, modules: dict[str, Any], constants: dict[str, int]) -> None:
        self.modules, self.constants = modules, constants

    def constant(self, name: str) -> int:
        return self.constants[name]

    def has(self, method: str) -> bool:
        return method in self.modules

    def run(self, method: str, *inputs: torch.Tensor) -> Any:
        with torch.no_grad():
            out = _ContiguousInterpreter(self.modules[method]).run(*(t.contiguous() for t in inputs))
        return out[0] if isinstance(out, (tuple, list)) and len(out) == 1 else out


class _ContiguousInterpreter(torch.fx.Interpreter):
    """A decomposed program's ``module()`` run node by node, each tensor operand laid out contiguously first: a
    decomposed graph calls kernels (``native_group_norm``) on a view whose strides the composite op it replaced
    made contiguous itself, which ExecuTorch's memory planning does but eager ATen refuses."""

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        args = tuple(arg.contiguous() if isinstance(arg, torch.Tensor) else arg for arg in args)
        return super().call_function(target, args, kwargs)


def token_ids(tokenizer: Any, text: str, length: int) -> torch.Tensor:
    """``text``'s ids padded and truncated to ``length``, as diffusers' pipelines tokenize, as the fp32 the text
    encoder methods take."""
    ids = tokenizer(text, padding="max_length", max_length=length, truncation=True, return_tensors="pt").input_ids
    return ids.to(torch.float32)


def encode(program: Any, tokenizers: dict[str, Any], text: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``text`` as the denoiser's conditioning ``[1, L, D]`` (and SD3's pooled ``[1, P]``; ``None`` for SD 1.x/2.x),
    as the family's pipeline encodes a prompt."""
    length = program.constant("get_max_text_len")
    ids = token_ids(tokenizers["text_encoder"], text, length)
    if program.constant("get_family") == STABLE_DIFFUSION.code:
        return program.run("text_encoder", ids), None
    # StableDiffusion3Pipeline.encode_prompt: both CLIPs' penultimate states side by side, padded to the joint width,
    # then T5's (zeros without it); the pooled projections side by side
    first, first_pooled = program.run("text_encoder", ids)
    second, second_pooled = program.run("text_encoder_2", token_ids(tokenizers["text_encoder_2"], text, length))
    width = program.constant("get_text_dim")
    clip = torch.nn.functional.pad(torch.cat([first, second], -1), (0, width - first.shape[-1] - second.shape[-1]))
    if program.has("text_encoder_3"):
        t5 = program.run("text_encoder_3", token_ids(tokenizers["text_encoder_3"], text, T5_LENGTH))
    else:
        t5 = torch.zeros(1, T5_LENGTH, width, dtype=clip.dtype)
    return torch.cat([clip, t5], -2), torch.cat([first_pooled, second_pooled], -1)


def generate(
    program: Any,
    prompt: str,
    *,
    negative_prompt: str = "",
    seed: int = 0,
    steps: int = 25,
    guidance: float = 7.5,
    scheduler: str | None = None,
    tokenizers: dict[str, Any] | None = None,
    scheduler_config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """The image ``[H, W, 3]`` (uint8) of ``prompt``: the family's diffusers pipeline's at the same ``seed``,
    ``steps``, ``guidance`` and scheduler (the pipeline's own, or ``scheduler`` by its ``--scheduler`` name).
    ``program`` is an :class:`ImageProgram` or :class:`EagerMethods`; the tokenizers (by text encoder method) and
    scheduler config are the ones beside the ``.pte`` unless given.
    """
    from coreai_partitioner.text_to_image.schedulers import build_scheduler

    if steps < 1:
        raise ValueError(f"--steps {steps}: give at least 1")
    family = STABLE_DIFFUSION if program.constant("get_family") == STABLE_DIFFUSION.code else STABLE_DIFFUSION_3
    steps_with = build_scheduler(scheduler_config or program.scheduler_config(), scheduler, family.schedulers)
    tokenizers = tokenizers or program.tokenizers()
    (negative, negative_pooled), (positive, pooled) = (encode(program, tokenizers, t) for t in (negative_prompt, prompt))
    text = torch.cat([negative, positive])
    dtype = text.dtype
    scale = program.constant("get_vae_scale")
    shape = (1, program.constant("get_latent_channels"), program.constant("get_height") // scale,
             program.constant("get_width") // scale)
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(shape, generator=generator, dtype=dtype)
    weight = torch.tensor([max(guidance, 1.0)], dtype=dtype)  # at most 1, diffusers takes the prompt's prediction alone
    if family is STABLE_DIFFUSION:
        steps_with.set_timesteps(steps)
        latents = latents * steps_with.init_noise_sigma
        accepted = set(inspect.signature(steps_with.step).parameters)
        extra = {**({"eta": 0.0} if "eta" in accepted else {}), **({"generator": generator} if "generator" in accepted else {})}
        for timestep in steps_with.timesteps:
            scaled = steps_with.scale_model_input(latents, timestep)
            noise = program.run("denoiser", scaled.to(dtype), timestep.reshape(1).float(), text, weight)
            latents = steps_with.step(noise, timestep, latents, **extra, return_dict=False)[0]
    else:
        steps_with.set_timesteps(steps, **_shift(steps_with, shape, program.constant("get_patch_size")))
        pooled = torch.cat([negative_pooled, pooled])
        for timestep in steps_with.timesteps:
            velocity = program.run("denoiser", latents.to(dtype), timestep.reshape(1).float(), text, pooled, weight)
            latents = steps_with.step(velocity, timestep, latents, return_dict=False)[0]
    image = program.run("vae_decoder", latents.to(dtype))
    return (image[0].permute(1, 2, 0).float() * 255).round().to(torch.uint8)


def _shift(scheduler: Any, shape: tuple[int, ...], patch: int) -> dict[str, float]:
    """``StableDiffusion3Pipeline``'s ``mu`` for a scheduler with dynamic shifting (none by default)."""
    config = scheduler.config
    if not config.get("use_dynamic_shifting"):
        return {}
    from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

    sequence = (shape[2] // patch) * (shape[3] // patch)
    return {"mu": calculate_shift(sequence, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                                  config.get("base_shift", 0.5), config.get("max_shift", 1.16))}


def write_png(image: torch.Tensor, path: str | os.PathLike) -> Path:
    """``image`` (``[H, W, 3]`` uint8) as a PNG; the path."""
    from PIL import Image

    path = Path(path)
    Image.fromarray(image.numpy()).save(path)
    return path
