"""Export a Hugging Face vision-language model to one .pte for ExecuTorch's MultimodalRunner, with Core AI composites.

    python -m coreai_partitioner export --config gemma3 --verify                  # tiny random model
    python -m coreai_partitioner export --checkpoint path/to/checkpoint --dtype fp16 --verify --out out/model.pte
    python -m coreai_partitioner export --checkpoint path/to/checkpoint --image cat.jpg --generate "What is this? <image>"
    python -m coreai_partitioner export --checkpoint path/to/checkpoint --num-layers 2 --vision-layers 2 --dry-run

(the task, ``image-text-to-text``, is read off the checkpoint's config.)
The .pte has the three methods ExecuTorch's ``MultimodalRunner`` calls:
``vision_encoder(pixels [1, 3, H, W]) -> [1, N, D]``,
``token_embedding(tokens [1, n]) -> [1, n, D]`` and
``text_decoder(embeddings [1, S, D], positions [S]) -> logits``, S up to
``--prefill-chunk`` (an image's N tokens, or a prompt segment, in one call),
each method one delegate and a function of one Core AI asset that stores the
weights once; plus the runner's metadata methods.  Beside it: the
checkpoint's ``tokenizer.json`` and ``preprocessor_config.json`` (the size,
mean and std the caller resizes and normalizes an image with: the runner
does neither).  ``--verify`` judges image embeddings, logits and greedy
tokens against the eager model it was lowered from (quantized, at
``--dtype``) before keeping the .pte, the fp32 model's distance beside them
as a report (:mod:`coreai_partitioner.image_text_to_text.check`); ``--generate`` runs the prompt and
``--image`` through ``MultimodalRunner``.  ``--config`` builds a tiny random
model of a family with a one-character-per-token tokenizer.  Nothing is
downloaded.  Needs the hf extra.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner import console
from coreai_partitioner.cli.command import CommandError
from coreai_partitioner.cli.detect import Detection, Head
from coreai_partitioner.cli.task import Phases, Plan, describe_tokenizer, first_layers, partitioner_options, tokenizer_and_preprocessor, tokenizer_beside

NAME = "image-text-to-text"
DETECT = Detection(
    takes="a *ForImageTextToText, or a *ForConditionalGeneration with a vision_config, or a VLM family's model_type",
    heads=(Head("ForConditionalGeneration", key="vision_config"), Head("ForImageTextToText")),
    model_types=lambda: tiny_configs(),  # a tiny model per family, named by the model type the family adapts
    own_refusal=lambda config: not_a_vision_language_model(config),
)
MODEL = "AutoModelForImageTextToText"
RUNNER = "MultimodalRunner"
FLAGS = ("--quantize", "--num-layers", "--max-context-len", "--prefill-chunk", "--no-tokenizer", "--generate", "--new-tokens")
DEFAULTS: dict[str, Any] = {}


def not_a_vision_language_model(config: Any) -> None:
    """Refuse a checkpoint of another task in this task's words: a text-only model is text generation's."""
    from coreai_partitioner.image_text_to_text import family_of

    family_of(config)


def tiny_configs() -> list[str]:
    from coreai_partitioner.image_text_to_text import supported

    return list(supported())


def tiny_config(name: str) -> Any:
    from coreai_partitioner.image_text_to_text import tiny_config

    return tiny_config(name)


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vision-layers", type=int, help="the vision tower's first N layers only (fast trials)")
    parser.add_argument(
        "--image", type=Path,
        help="an image file (the processor resizes it) or a .pt tensor of pixel values [3, H, W], for --verify and --generate",
    )
    parser.add_argument("--prompt", help="--verify's prompt, with the processor's image placeholder (default: 'Describe <image>')")


def refusals() -> tuple[type[Exception], ...]:
    from coreai_partitioner.text_decoder import UnsupportedConfig, UnsupportedModel, UnsupportedShapes
    from coreai_partitioner.text_decoder.device import UnsupportedDevice
    from coreai_partitioner.text_decoder.tokenizer import TokenizerError
    from coreai_partitioner.quantize import QuantizationError
    from coreai_partitioner.verify import fidelity
    from coreai_partitioner.image_text_to_text import ImageTokensOverBound, UnsupportedImage, UnsupportedVisionConfig, UnsupportedVisionModel

    return (
        UnsupportedVisionModel, UnsupportedVisionConfig, UnsupportedImage, ImageTokensOverBound, UnsupportedModel,
        UnsupportedConfig, UnsupportedShapes, UnsupportedDevice, QuantizationError, TokenizerError,
        fidelity.UnknownPrecision,
    )


# ---------------------------------------------------------------- before any export work


@dataclass
class VisionPlan(Plan):
    shapes: Any = None  # decoder.DecoderShapes of text_decoder
    family: Any = None  # the vision family module
    processor: Any = None  # the HF processor, when --verify or --generate needs it
    pixels: torch.Tensor | None = None  # --image's pixel values, when it is a tensor


def settle(args: argparse.Namespace, config: Any) -> VisionPlan:
    """Config and family, shapes, processor, image."""
    from coreai_partitioner.text_decoder import DecoderShapes
    from coreai_partitioner.image_text_to_text import check_config, family_of

    if args.vision_layers is not None and args.vision_layers < 1:
        raise CommandError(f"--vision-layers {args.vision_layers}: give at least 1")
    vision = getattr(config, "vision_config", None)
    if vision is not None:  # without one, check_config says what the checkpoint is
        config = first_layers(config, args)
        if args.vision_layers is not None:
            if args.vision_layers > vision.num_hidden_layers:
                raise CommandError(f"--vision-layers {args.vision_layers}: the tower has {vision.num_hidden_layers} layers")
            vision.num_hidden_layers = args.vision_layers
    family = family_of(config)
    tokens = family.image_tokens(config)
    limit = getattr(config.get_text_config(), "max_position_embeddings", None) or 1024
    context = args.max_context_len or min(1024, limit)
    chunk = args.prefill_chunk or min(max(128, tokens), context)
    window = smallest_window(config.get_text_config())
    if args.target == "device" and window is not None:  # the device form writes a call's rows into a sliding ring at once
        if tokens > window:
            raise CommandError(
                f"{config.model_type}: one image is {tokens} embeddings, which the runner hands text_decoder in one call, "
                f"and the device form's calls are at most the smallest sliding window ({window}); no --prefill-chunk "
                "fits both: export it in the host form (--target host)"
            )
        if args.prefill_chunk is not None and args.prefill_chunk > window:
            raise CommandError(
                f"--prefill-chunk {args.prefill_chunk}: the device form writes a call's rows into each sliding window's "
                f"ring at once, and {config.model_type}'s smallest window is {window}; give --prefill-chunk {tokens} to "
                f"{window} (one image is {tokens} embeddings)"
            )
        chunk = min(chunk, window)
    try:
        # No verify method: MultimodalRunner's text_decoder is the only call (and its rings need no spare slots).
        shapes = DecoderShapes(context, chunk, "dynamic", args.target, verify_len=0)
    except ValueError as error:
        raise CommandError(str(error)) from None
    check_config(config, shapes)
    if args.generate is not None and args.image is None:
        raise CommandError("--generate needs an --image")
    processor = load_processor(args, config, family) if (args.verify or args.generate is not None) else None
    pixels = load_pixels(args, config) if args.image is not None else None
    return VisionPlan(args, config, shapes=shapes, family=family, processor=processor, pixels=pixels)


def smallest_window(text_config) -> int | None:
    """The smallest sliding window of a text config's layers, or None."""
    window = getattr(text_config, "sliding_window", None)
    types = getattr(text_config, "layer_types", None) or []
    return window if isinstance(window, int) and "sliding_attention" in types else None


def load_processor(args: argparse.Namespace, config, family):
    """The checkpoint's processor (or the tiny config's), which --verify and --generate prompt the model with."""
    if not args.checkpoint:
        return family.tiny_processor(config)
    from transformers import AutoProcessor

    try:
        with console.NativeStreams():
            return AutoProcessor.from_pretrained(args.checkpoint, local_files_only=True)
    except (OSError, ValueError, ImportError) as error:
        raise CommandError(f"--verify and --generate need the checkpoint's processor, which transformers cannot load: {error}") from None


def load_pixels(args: argparse.Namespace, config) -> torch.Tensor | None:
    """``--image`` as pixel values when it is a ``.pt`` tensor (checked against the tower's size); ``None`` for a file."""
    from coreai_partitioner.image_text_to_text import UnsupportedImage
    from coreai_partitioner.image_text_to_text.run import check_image

    if not args.image.is_file():
        raise CommandError(f"--image {args.image}: no such file")
    if args.image.suffix != ".pt":
        return None
    pixels = torch.load(args.image, weights_only=True)
    if not isinstance(pixels, torch.Tensor):
        raise UnsupportedImage(f"--image {args.image}: holds a {type(pixels).__name__}, not a tensor of pixel values")
    size = config.vision_config.image_size
    try:
        check_image(pixels, (size, size))
    except UnsupportedImage as error:
        raise UnsupportedImage(f"--image {args.image}: {error}") from None
    return pixels.reshape(3, size, size).float()


def dry_run(plan: VisionPlan) -> None:
    """What would be exported, from the config alone."""
    config, shapes = plan.config, plan.shapes
    vision, text = config.vision_config, config.get_text_config()
    size = vision.image_size
    print(f"{config.model_type} (vision family {plan.family.__name__.rsplit('.', 1)[-1]}.py)")
    print(f"  vision_encoder(pixels [1, 3, {size}, {size}]) -> [1, {plan.family.image_tokens(config)}, D]; "
          f"a tower of {vision.num_hidden_layers} layer(s)")
    print(f"  token_embedding(tokens [1, n]) -> [1, n, D]; n 1..{shapes.prefill_chunk}")
    print(f"  text_decoder(embeddings [1, S, D], positions [S]) -> logits [1, 1, {text.vocab_size}]; S 1..{shapes.prefill_chunk}, "
          f"context {shapes.max_context_len}; a {text.model_type} decoder of {text.num_hidden_layers} layer(s)")
    print(f"  tokenizer: {describe_tokenizer(plan)}")
    print(f"  would write {plan.args.out}")


def prompt_inputs(plan: VisionPlan, text: str | None) -> Any:
    """The processor's inputs for ``text`` (default ``Describe <placeholder>``) and ``--image`` (a seeded random image
    without one)."""
    import numpy as np

    processor = plan.processor
    placeholder = getattr(processor, "image_token", "<image>")
    text = text if text is not None else f"Describe {placeholder}"
    if placeholder not in text:
        raise CommandError(f"the prompt {text!r} has no image placeholder {placeholder!r}; put it where the image goes")
    if plan.args.image is None:
        image = (np.random.default_rng(0).random((plan.config.vision_config.image_size,) * 2 + (3,)) * 255).astype("uint8")
    elif plan.pixels is not None:
        return _with_pixels(processor(text=text, images=np.zeros((8, 8, 3), dtype="uint8"), return_tensors="pt"), plan.pixels)
    else:
        from PIL import Image

        image = Image.open(plan.args.image).convert("RGB")
    return processor(text=text, images=image, return_tensors="pt")


def _with_pixels(processed: Any, pixels: torch.Tensor) -> Any:
    """The processor's inputs with its pixel values replaced by the caller's (one image, one tile)."""
    if processed["pixel_values"].reshape(-1, *processed["pixel_values"].shape[-3:]).shape[0] != 1:
        raise CommandError("--image as pixel values takes one image of one tile; give an image file for a tiled image")
    processed["pixel_values"] = pixels.reshape(processed["pixel_values"].shape)
    return processed


# ---------------------------------------------------------------- export


def reference(plan: VisionPlan, model: torch.nn.Module) -> Any:
    from coreai_partitioner.image_text_to_text.check import reference

    tokens = plan.family.image_tokens(plan.config)
    return reference(model, prompt_inputs(plan, plan.args.prompt), plan.config.image_token_id, tokens)


def lower(plan: VisionPlan, model: torch.nn.Module, phases: Phases) -> tuple[Any, Any]:
    """The three methods lowered; under ``--verify`` the eager methods they were lowered from (the quantized eager
    methods under --quantize, the model's at --dtype otherwise; ``None`` at fp32)."""
    from coreai_partitioner.image_text_to_text import adapt, lower_vlm
    from coreai_partitioner.image_text_to_text.run import Methods

    with phases("adapt"):
        vlm = adapt(model, plan.shapes)
    quantized: dict = {}
    with phases("export and lower"):
        lowered = lower_vlm(
            model, plan.shapes, vlm=vlm, quantize=plan.args.quantize, quantized_reference=quantized,
            **partitioner_options(plan.args),
        )
    if not plan.args.verify or (not quantized and plan.dtype == torch.float32):
        return lowered, None
    return lowered, Methods.of(quantized or vlm)


def eager(plan: VisionPlan, lowered: Any, lowered_from: Any, verified: Any) -> Any:
    """The eager methods' outputs, fed as the runner feeds the ``.pte``."""
    from coreai_partitioner.image_text_to_text.check import program_outputs

    return program_outputs(lowered_from, verified)


def describe(plan: VisionPlan, model: torch.nn.Module, pte: Any) -> None:
    config, shapes = plan.config, plan.shapes
    vision, text = config.vision_config, config.get_text_config()
    print(f"{type(model).__name__} ({config.model_type}): a tower of {vision.num_hidden_layers} layer(s), a "
          f"{text.model_type} decoder of {text.num_hidden_layers}, {plan.args.dtype}")
    print(f"  methods: {', '.join(m for m in pte.methods)}")
    print(f"  an image [3, {vision.image_size}, {vision.image_size}] is {plan.family.image_tokens(config)} embeddings; "
          f"text_decoder takes 1 to {shapes.prefill_chunk} a call, context {shapes.max_context_len}")
    hashes = {d.manifest["hash"] for d in pte.coreai_delegates()}
    print(f"  {len(pte.coreai_delegates())} Core AI delegate(s), {len(hashes)} asset")


def check(plan: VisionPlan, path: Path, verified: Any, eager: Any) -> Any:
    from coreai_partitioner.image_text_to_text.check import check

    return check(path, verified, eager=eager, dtype=plan.dtype, quantize=plan.args.quantize)


def companions(plan: VisionPlan, directory: Path) -> list[Path]:
    """The tokenizer and the image processor's config: what a caller needs besides the .pte."""

    def tiny() -> tuple[Any, Any]:
        processor = plan.processor or plan.family.tiny_processor(plan.config)
        return processor.tokenizer, processor.image_processor

    return tokenizer_and_preprocessor(
        plan, directory, tiny,
        "a caller must resize and normalize images itself (the .pte's get_image_size says to what size)",
    )


# ---------------------------------------------------------------- running the .pte


def after(plan: VisionPlan) -> None:
    """``--generate``'s prompt and ``--image`` through ExecuTorch's ``MultimodalRunner``, the text as it comes."""
    from coreai_partitioner.image_text_to_text.run import generate as runner_generate
    from coreai_partitioner.image_text_to_text.run import runner_inputs

    args = plan.args
    if args.generate is None:
        return
    processed = prompt_inputs(plan, args.generate)
    segments = runner_inputs(processed, plan.config.image_token_id, plan.family.image_tokens(plan.config))
    tokenizer = tokenizer_beside(plan)
    start = time.perf_counter()
    pieces = runner_generate(args.out, tokenizer, segments, args.new_tokens)
    print(f"\ngenerate: {args.generate!r} -> {''.join(pieces)!r}")
    print(f"  {len(segments)} segment(s), {len(pieces)} token(s) in {time.perf_counter() - start:.1f} s (MultimodalRunner)")
