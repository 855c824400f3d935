"""The text-to-image loop: a prompt through a ``.pte``'s three methods and diffusers' scheduler to an image.

:func:`generate` follows ``StableDiffusionPipeline.__call__`` step by step:
the prompt and the negative prompt tokenized to the text encoder's length,
the initial latents drawn from ``torch.Generator().manual_seed(seed)`` as
diffusers' ``randn_tensor`` draws them and scaled by the scheduler's initial
sigma, each of the scheduler's timesteps a ``denoiser`` call and a scheduler
step (the generator handed to the steps that draw, as diffusers hands it), then
``vae_decoder``.  The same seed, scheduler, step count and guidance give
diffusers' image.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.text_to_image.pipeline import SCHEDULER_CONFIG
from coreai_partitioner.text_to_image.stable_diffusion import METHODS


class ImageProgram:
    """A text-to-image ``.pte`` loaded in ExecuTorch's runtime, its Core AI delegates on this package's host backend,
    with the tokenizer and scheduler config written beside it; the program is held as long as its methods run."""

    def __init__(self, pte: str | os.PathLike) -> None:
        from coreai_partitioner.backends.apple_coreai.runtime import host

        self.path = Path(pte)
        self.program = host.load_program(self.path)
        missing = set(METHODS) - set(self.program.method_names)
        if missing:
            raise ValueError(
                f"{self.path}: no method {', '.join(sorted(missing))}; it has {', '.join(sorted(self.program.method_names))}: "
                "export a text-to-image pipeline (python -m coreai_partitioner export --checkpoint PIPELINE_DIR)"
            )
        self.methods = {name: self.program.load_method(name) for name in METHODS}

    def constant(self, name: str) -> int:
        return int(self.program.load_method(name).execute([])[0])

    def run(self, method: str, *inputs: torch.Tensor) -> torch.Tensor:
        return self.methods[method].execute([t.contiguous() for t in inputs])[0]

    def tokenizer(self) -> Any:
        """The CLIP tokenizer written beside the ``.pte``."""
        from transformers import CLIPTokenizer

        if not (self.path.parent / "tokenizer_config.json").is_file():
            raise ValueError(f"{self.path.parent}: no tokenizer_config.json beside {self.path.name}: export the pipeline "
                             "again, which writes its tokenizer there")
        return CLIPTokenizer.from_pretrained(self.path.parent)

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

    def run(self, method: str, *inputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = _ContiguousInterpreter(self.modules[method]).run(*(t.contiguous() for t in inputs))
        return out[0] if isinstance(out, (tuple, list)) else out


class _ContiguousInterpreter(torch.fx.Interpreter):
    """A decomposed program's ``module()`` run node by node, each tensor operand laid out contiguously first: a
    decomposed graph calls kernels (``native_group_norm``) on a view whose strides the composite op it replaced
    made contiguous itself, which ExecuTorch's memory planning does but eager ATen refuses."""

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        args = tuple(arg.contiguous() if isinstance(arg, torch.Tensor) else arg for arg in args)
        return super().call_function(target, args, kwargs)


def token_ids(tokenizer: Any, text: str, length: int) -> torch.Tensor:
    """``text``'s ids padded and truncated to ``length``, as diffusers' ``encode_prompt`` tokenizes."""
    return tokenizer(text, padding="max_length", max_length=length, truncation=True, return_tensors="pt").input_ids


def generate(
    program: ImageProgram,
    prompt: str,
    *,
    negative_prompt: str = "",
    seed: int = 0,
    steps: int = 25,
    guidance: float = 7.5,
    scheduler: str | None = None,
    tokenizer: Any = None,
    scheduler_config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """The image ``[H, W, 3]`` (uint8) of ``prompt``: ``StableDiffusionPipeline``'s at the same ``seed``, ``steps``,
    ``guidance`` and scheduler (the pipeline's own, or ``scheduler`` by its ``--scheduler`` name).  The tokenizer and
    scheduler config are the ones beside the ``.pte`` unless given.
    """
    from coreai_partitioner.text_to_image.schedulers import build_scheduler

    if steps < 1:
        raise ValueError(f"--steps {steps}: give at least 1")
    steps_with = build_scheduler(scheduler_config or program.scheduler_config(), scheduler)
    tokenizer = tokenizer or program.tokenizer()
    length = program.constant("get_max_text_len")
    hidden = [program.run("text_encoder", token_ids(tokenizer, text, length)) for text in (negative_prompt, prompt)]
    text = torch.cat(hidden)
    dtype = text.dtype
    steps_with.set_timesteps(steps)
    generator = torch.Generator().manual_seed(seed)
    scale = program.constant("get_vae_scale")
    shape = (1, program.constant("get_latent_channels"), program.constant("get_height") // scale,
             program.constant("get_width") // scale)
    latents = torch.randn(shape, generator=generator, dtype=dtype) * steps_with.init_noise_sigma
    accepted = set(inspect.signature(steps_with.step).parameters)
    extra = {**({"eta": 0.0} if "eta" in accepted else {}), **({"generator": generator} if "generator" in accepted else {})}
    weight = torch.tensor([max(guidance, 1.0)], dtype=dtype)  # at most 1, diffusers takes the prompt's prediction alone
    for timestep in steps_with.timesteps:
        scaled = steps_with.scale_model_input(latents, timestep)
        noise = program.run("denoiser", scaled.to(dtype), timestep.reshape(1).float(), text, weight)
        latents = steps_with.step(noise, timestep, latents, **extra, return_dict=False)[0]
    image = program.run("vae_decoder", latents.to(dtype))
    return (image[0].permute(1, 2, 0).float() * 255).round().to(torch.uint8)


def write_png(image: torch.Tensor, path: str | os.PathLike) -> Path:
    """``image`` (``[H, W, 3]`` uint8) as a PNG; the path."""
    from PIL import Image

    path = Path(path)
    Image.fromarray(image.numpy()).save(path)
    return path
