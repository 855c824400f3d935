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
``--max-seq-len`` (an image's N tokens, or a prompt segment, in one call),
each method one delegate and a function of one Core AI asset that stores the
weights once; plus the runner's metadata methods.  Beside it: the
checkpoint's ``tokenizer.json`` and ``preprocessor_config.json`` (the size,
mean and std the caller resizes and normalizes an image with: the runner
does neither).  ``--verify`` judges image embeddings, logits and greedy
tokens against the eager model it was lowered from (quantized, at
``--dtype``) before keeping the .pte, the fp32 model's distance beside them
as a report (:mod:`coreai_partitioner.vision.check`); ``--generate`` runs the prompt and
``--image`` through ``MultimodalRunner``.  ``--config`` builds a tiny random
model of a family with a one-character-per-token tokenizer.  Nothing is
downloaded.  Needs the hf extra.
"""

from __future__ import annotations

import argparse
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner import console
from coreai_partitioner.cli.command import CommandError, run_command
from coreai_partitioner.quantize import SCHEMES

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def tiny_configs() -> list[str]:
    """The ``--config`` names: a tiny random model of each vision family (``python -m coreai_partitioner export`` asks)."""
    from coreai_partitioner.vision import supported

    return list(supported())


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from coreai_partitioner.llm import TARGETS

    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", choices=tiny_configs(), help="a tiny random model of this family")
    source.add_argument("--checkpoint", type=Path, help="a local Hugging Face checkpoint directory")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--num-layers", type=int, help="the text decoder's first N layers only (fast trials)")
    parser.add_argument("--vision-layers", type=int, help="the vision tower's first N layers only (fast trials)")
    parser.add_argument("--max-context-len", type=int, help="cache length (prompt, images and generated tokens); default 1024")
    parser.add_argument(
        "--max-seq-len", type=int,
        help="most embeddings one text_decoder call takes: an image's tokens, or a prompt segment; default max(128, an image's)",
    )
    parser.add_argument(
        "--target", choices=TARGETS, default="host",
        help="host: this package's runtime (caches as delegate state); device: upstream's on-device Core AI runtime "
        "(CoreAIBackend, fp16/fp32 tensors only, S bounded-dynamic up to --max-seq-len, caches owned by ExecuTorch)",
    )
    parser.add_argument(
        "--quantize", choices=tuple(SCHEMES),
        help=("weight-only, every weight of the text decoder and the tower's where they fit: " + "; ".join(SCHEMES.values())).replace("%", "%%"),
    )
    parser.add_argument("--out", type=Path, default=Path("model.pte"))
    parser.add_argument("--no-tokenizer", action="store_true", help="export without the checkpoint's tokenizer")
    parser.add_argument("--dry-run", action="store_true", help="print what would be exported, convert nothing")
    parser.add_argument("--verify", action="store_true", help="judge the .pte against the eager model it was lowered from before keeping it")
    parser.add_argument(
        "--image", type=Path,
        help="an image file (the processor resizes it) or a .pt tensor of pixel values [3, H, W], for --verify and --generate",
    )
    parser.add_argument("--prompt", help="--verify's prompt, with the processor's image placeholder (default: 'Describe <image>')")
    parser.add_argument("--generate", metavar="PROMPT", help="run PROMPT and --image through ExecuTorch's MultimodalRunner")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("-v", "--verbose", action="store_true", help="show the dependencies' own logs too")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the command; returns the exit status (errors print one line naming what and the fix)."""
    return run_command(build_parser, run, argv, prog)


# ---------------------------------------------------------------- before any export work


@dataclass
class Plan:
    """What the command will do, settled from its input before any weights are loaded."""

    args: argparse.Namespace
    shapes: Any  # llm.DecoderShapes
    config: Any
    family: Any
    tokenizer: Any  # llm.tokenizer.Tokenizer or None
    processor: Any  # the HF processor, when --verify or --generate needs it
    pixels: torch.Tensor | None  # --image's pixel values, when it is a tensor

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.args.dtype]


def run(args: argparse.Namespace) -> None:
    from coreai_partitioner.llm import UnsupportedConfig, UnsupportedModel, UnsupportedShapes
    from coreai_partitioner.decoder.device import UnsupportedDevice
    from coreai_partitioner.quantize import QuantizationError
    from coreai_partitioner.decoder.tokenizer import TokenizerError
    from coreai_partitioner.verify import fidelity
    from coreai_partitioner.vision import ImageTokensOverBound, UnsupportedImage, UnsupportedVisionConfig, UnsupportedVisionModel

    refused = (
        UnsupportedVisionModel, UnsupportedVisionConfig, UnsupportedImage, ImageTokensOverBound, UnsupportedModel,
        UnsupportedConfig, UnsupportedShapes, UnsupportedDevice, QuantizationError, TokenizerError,
        fidelity.UnknownPrecision,
    )
    try:
        plan = settle(args)
        if args.dry_run:
            dry_run(plan)
            return
        args.out.parent.mkdir(parents=True, exist_ok=True)
        partial = args.out.with_name(args.out.name + ".partial")
        try:
            export(plan, partial)
        finally:
            partial.unlink(missing_ok=True)
    except refused as error:
        raise CommandError(str(error)) from None
    if args.generate is not None:
        generate(plan)


def settle(args: argparse.Namespace) -> Plan:
    """Every check that needs no weights: config and family, shapes, tokenizer, processor, image."""
    from coreai_partitioner.llm import DecoderShapes
    from coreai_partitioner.vision import check_config, family_of

    for flag in ("num_layers", "vision_layers"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise CommandError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: give at least 1")
    config = model_config(args)
    family = family_of(config)
    tokens = family.image_tokens(config)
    limit = getattr(config.get_text_config(), "max_position_embeddings", None) or 1024
    context = args.max_context_len or min(1024, limit)
    chunk = args.max_seq_len or min(max(128, tokens), context)
    window = smallest_window(config.get_text_config())
    if args.target == "device" and args.max_seq_len is None and window is not None:
        chunk = min(chunk, window)  # the device form writes a call's rows into a sliding ring at once
    try:
        shapes = DecoderShapes(context, chunk, "dynamic", args.target)
    except ValueError as error:
        raise CommandError(str(error)) from None
    check_config(config, shapes)
    if args.generate is not None and args.image is None:
        raise CommandError("--generate needs an --image")
    processor = load_processor(args, config, family) if (args.verify or args.generate is not None) else None
    pixels = load_pixels(args, config) if args.image is not None else None
    return Plan(args, shapes, config, family, choose_tokenizer(args), processor, pixels)


def smallest_window(text_config) -> int | None:
    """The smallest sliding window of a text config's layers, or None."""
    window = getattr(text_config, "sliding_window", None)
    types = getattr(text_config, "layer_types", None) or []
    return window if isinstance(window, int) and "sliding_attention" in types else None


def model_config(args: argparse.Namespace):
    """The config to export (its first ``--num-layers`` / ``--vision-layers`` layers)."""
    from transformers import AutoConfig

    from coreai_partitioner.llm import first_layers
    from coreai_partitioner.vision import tiny_config

    if args.checkpoint:
        if not (args.checkpoint / "config.json").is_file():
            what = "no such directory" if not args.checkpoint.is_dir() else "no config.json in it"
            raise CommandError(f"--checkpoint {args.checkpoint}: {what}; give a local Hugging Face checkpoint directory")
        config = AutoConfig.from_pretrained(args.checkpoint, local_files_only=True)
    else:
        config = tiny_config(args.config)
    if args.num_layers is not None and getattr(config, "vision_config", None) is not None:
        try:
            config = first_layers(config, args.num_layers)
        except ValueError as error:
            raise CommandError(str(error)) from None
    vision = getattr(config, "vision_config", None)
    if args.vision_layers is not None and vision is not None:
        if args.vision_layers > vision.num_hidden_layers:
            raise CommandError(f"--vision-layers {args.vision_layers}: the tower has {vision.num_hidden_layers} layers")
        vision.num_hidden_layers = args.vision_layers
    return config


def choose_tokenizer(args: argparse.Namespace):
    """The checkpoint's tokenizer, checked as ExecuTorch's runner loads it, before any export work."""
    from coreai_partitioner.llm import tokenizer

    if not args.checkpoint or args.no_tokenizer:
        return None
    found = tokenizer.find(args.checkpoint)
    if found is None:
        warnings.warn(
            f"{args.checkpoint} has no tokenizer (tokenizer.json, tokenizer.model); the .pte is exported without one, "
            "and MultimodalRunner will need one (--no-tokenizer says this is meant)",
            stacklevel=2,
        )
        return None
    return tokenizer.check(found)


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
    from coreai_partitioner.vision import UnsupportedImage
    from coreai_partitioner.vision.run import check_image

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


def dry_run(plan: Plan) -> None:
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
    print(f"  tokenizer: {plan.tokenizer.describe() if plan.tokenizer else 'one character per token (tiny config)' if not plan.args.checkpoint else 'none'}")
    print(f"  would write {plan.args.out}")


# ---------------------------------------------------------------- export


def load_model(args: argparse.Namespace, config, dtype: torch.dtype) -> torch.nn.Module:
    """The checkpoint at ``dtype``; or the tiny config's seeded model, made in fp32 and cast."""
    from transformers import AutoModelForImageTextToText
    from transformers.utils import logging as transformers_logging

    if not console.verbose():
        transformers_logging.disable_progress_bar()
    if args.checkpoint:
        return AutoModelForImageTextToText.from_pretrained(
            args.checkpoint, config=config, dtype=dtype, local_files_only=True, attn_implementation="eager"
        ).eval()
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32, attn_implementation="eager").eval()
    return model if dtype == torch.float32 else model.to(dtype)


def prompt_inputs(plan: Plan, text: str | None) -> Any:
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


def export(plan: Plan, partial: Path) -> None:
    """Load, export, write ``partial``, verify it; then it becomes ``--out``, the tokenizer and preprocessor beside it."""
    from tqdm import tqdm

    from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte
    from coreai_partitioner.vision import adapt, lower_vlm
    from coreai_partitioner.vision.check import reference

    args, shapes = plan.args, plan.shapes
    phases: dict[str, float] = {}
    verified = None
    with tqdm(total=5 if args.verify else 4, unit="phase", leave=False) as bar:
        model = None
        if args.verify:
            bar.set_description("fp32 reference")
            start = time.perf_counter()
            model = load_model(args, plan.config, torch.float32)
            tokens = plan.family.image_tokens(plan.config)
            verified = reference(model, prompt_inputs(plan, args.prompt), plan.config.image_token_id, tokens)
            if plan.dtype != torch.float32:
                model = None
            phases["fp32 reference"] = time.perf_counter() - start
            bar.update()
        bar.set_description("load model")
        start = time.perf_counter()
        if model is None:
            model = load_model(args, plan.config, plan.dtype)
        phases["load"] = time.perf_counter() - start
        bar.update()
        bar.set_description("adapt")
        start = time.perf_counter()
        vlm = adapt(model, shapes)
        phases["adapt"] = time.perf_counter() - start
        bar.update()
        bar.set_description("export and lower")
        start = time.perf_counter()
        quantized: dict = {}
        lowered = lower_vlm(model, shapes, vlm=vlm, quantize=args.quantize, quantized_reference=quantized)
        phases["export and lower"] = time.perf_counter() - start
        bar.update()
        bar.set_description("write")
        start = time.perf_counter()
        with open(partial, "wb") as file:
            lowered.to_executorch().write_to_file(file)
        del lowered
        phases["write"] = time.perf_counter() - start
        bar.update()

    pte = read_pte(partial)
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    print(f"{type(model).__name__} ({plan.config.model_type}): a tower of {len(vlm.tower.layers)} layer(s), a "
          f"{vlm.decoder.model_type} decoder of {len(vlm.decoder.layers)}, {args.dtype}")
    print(f"  methods: {', '.join(m for m in pte.methods)}")
    print(f"  an image [3, {vlm.image_size[0]}, {vlm.image_size[1]}] is {vlm.image_tokens} embeddings; text_decoder takes "
          f"1 to {shapes.prefill_chunk} a call, context {shapes.max_context_len}")
    hashes = {d.manifest["hash"] for d in pte.coreai_delegates()}
    print(f"  {len(pte.coreai_delegates())} Core AI delegate(s), {len(hashes)} asset; .pte {pte.size:,} bytes, weights "
          f"{weights:,} bytes ({pte.size / weights:.3f}x)")
    print("  seconds: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items()))
    if verified is not None:
        verify_pte(plan, partial, verified, eager_outputs(plan, vlm, quantized, verified))
    partial.replace(args.out)
    written = write_beside(plan, args.out.parent)
    print(f"wrote {args.out}" + (f" and {', '.join(p.name for p in written)}" if written else ""))


def eager_outputs(plan: Plan, vlm, quantized: dict, verified) -> tuple | None:
    """What the .pte is judged against: the eager model it was lowered from, fed as the runner feeds it (the
    quantized eager methods under --quantize, the model at --dtype otherwise); None for fp32, the reference's."""
    from coreai_partitioner.vision.check import program_outputs
    from coreai_partitioner.vision.run import Methods

    if quantized:
        return program_outputs(Methods.of(quantized), verified)
    return None if plan.dtype == torch.float32 else program_outputs(Methods.of(vlm), verified)


def verify_pte(plan: Plan, pte: Path, verified, eager) -> None:
    """Print the .pte's report against the eager model it was lowered from (the fp32 model's distance beside
    it); a .pte that falls short is not kept."""
    from coreai_partitioner.vision.check import check

    start = time.perf_counter()
    with console.NativeStreams():
        report = check(pte, verified, eager=eager, dtype=plan.dtype, quantize=plan.args.quantize)
    print(f"\n{report}\n  ({time.perf_counter() - start:.1f} s)")
    if not report.ok:
        raise CommandError(f"the .pte is not close enough to {report.against}; {plan.args.out} not written")


def write_beside(plan: Plan, directory: Path) -> list[Path]:
    """The tokenizer and the image processor's config beside the .pte: what a caller needs besides it."""
    from coreai_partitioner.llm import tokenizer

    args = plan.args
    written: list[Path] = []
    if plan.tokenizer is not None:
        written += tokenizer.copy(plan.tokenizer, directory)[:1]
    if args.checkpoint:
        source = args.checkpoint / "preprocessor_config.json"
        if source.is_file():
            target = directory / source.name
            if source.resolve() != target.resolve():
                target.write_bytes(source.read_bytes())
            written.append(target)
        else:
            warnings.warn(
                f"{args.checkpoint} has no preprocessor_config.json: a caller must resize and normalize images itself "
                "(the .pte's get_image_size says to what size)",
                stacklevel=2,
            )
    else:
        processor = plan.processor or plan.family.tiny_processor(plan.config)
        processor.tokenizer.backend_tokenizer.save(str(directory / "tokenizer.json"))
        processor.image_processor.to_json_file(str(directory / "preprocessor_config.json"))
        written += [directory / "tokenizer.json", directory / "preprocessor_config.json"]
    return written


# ---------------------------------------------------------------- running the .pte


def generate(plan: Plan) -> None:
    """``--generate``'s prompt and ``--image`` through ExecuTorch's ``MultimodalRunner``, the text as it comes."""
    from coreai_partitioner.vision.run import generate as runner_generate
    from coreai_partitioner.vision.run import runner_inputs

    args = plan.args
    processed = prompt_inputs(plan, args.generate)
    segments = runner_inputs(processed, plan.config.image_token_id, plan.family.image_tokens(plan.config))
    tokenizer = args.out.parent / (plan.tokenizer.path.name if plan.tokenizer else "tokenizer.json")
    start = time.perf_counter()
    pieces = runner_generate(args.out, tokenizer, segments, args.new_tokens)
    print(f"\ngenerate: {args.generate!r} -> {''.join(pieces)!r}")
    print(f"  {len(segments)} segment(s), {len(pieces)} token(s) in {time.perf_counter() - start:.1f} s (MultimodalRunner)")
