"""A processor's prompt as the runner's inputs, and the exported program run as ExecuTorch's ``MultimodalRunner`` runs it.

:func:`runner_inputs` turns a Hugging Face processor's output (``input_ids``
with each image's placeholder tokens, ``pixel_values``) into the segments an
app hands the runner: text tokens, one image per run of ``image_tokens``
placeholders (a SmolVLM tile is an image of its own), text tokens, ...
:func:`generate` runs ExecuTorch's own ``MultimodalRunner`` on a ``.pte``;
:func:`greedy` runs any of the three forms of the methods (the eager
:class:`~.model.VisionLanguage`, a lowered program, a ``.pte``) the runner's way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.image_text_to_text.errors import UnsupportedImage


@dataclass(frozen=True)
class Segment:
    """One runner input: text ``tokens``, or one image's ``pixels`` ``[3, H, W]``."""

    tokens: tuple[int, ...] = ()
    pixels: torch.Tensor | None = None

    @property
    def is_image(self) -> bool:
        return self.pixels is not None


def runner_inputs(processed: Any, image_token_id: int, image_tokens: int) -> list[Segment]:
    """The runner's inputs for a processor's output: text between images, an image per ``image_tokens`` placeholders.

    ``processed`` has ``input_ids`` ``[1, L]`` and, with images,
    ``pixel_values`` ``[images, 3, H, W]`` or ``[1, images, 3, H, W]``
    (SmolVLM's tiles); the images go to the placeholder runs in order.
    """
    ids = processed["input_ids"]
    ids = (ids[0] if ids.dim() == 2 else ids).tolist()
    pixels = processed.get("pixel_values")
    images = [] if pixels is None else list(pixels.reshape(-1, *pixels.shape[-3:]))
    segments: list[Segment] = []
    text: list[int] = []
    index = used = 0
    while index < len(ids):
        if ids[index] != image_token_id:
            text.append(ids[index])
            index += 1
            continue
        run = ids[index : index + image_tokens]
        if len(run) < image_tokens or any(t != image_token_id for t in run):
            raise UnsupportedImage(f"a run of image placeholders at token {index} is not a whole image of {image_tokens} tokens")
        if used == len(images):
            raise UnsupportedImage(f"the prompt has more images than pixel_values ({len(images)})")
        if text:
            segments.append(Segment(tokens=tuple(text)))
            text = []
        segments.append(Segment(pixels=images[used]))
        used += 1
        index += image_tokens
    if text:
        segments.append(Segment(tokens=tuple(text)))
    if used != len(images):
        raise UnsupportedImage(f"pixel_values holds {len(images)} images and the prompt places {used}")
    return segments


def check_image(pixels: torch.Tensor, size: tuple[int, int]) -> None:
    """Raise unless ``pixels`` is ``[3, H, W]`` (or ``[1, 3, H, W]``) at the exported ``size``."""
    shape = tuple(pixels.shape[-3:]) if pixels.dim() in (3, 4) else tuple(pixels.shape)
    if pixels.dim() not in (3, 4) or (pixels.dim() == 4 and pixels.shape[0] != 1) or shape != (3, *size):
        raise UnsupportedImage(
            f"an image of shape {tuple(pixels.shape)}: the vision encoder was exported for [3, {size[0]}, {size[1]}] "
            f"(channels, height, width); resize it to {size[1]}x{size[0]} and normalize it as the processor does "
            "(preprocessor_config.json beside the .pte), or give the processor's pixel_values"
        )


class Methods:
    """The three methods of one program, called by name: ``call(method, *inputs) -> first output``."""

    def __init__(self, call: Callable[..., torch.Tensor], reset: Callable[[], None] = lambda: None) -> None:
        self.call = call
        self.reset = reset

    @classmethod
    def of(cls, program: Any) -> Methods:
        """The methods of an eager :class:`~.model.VisionLanguage`; of a quantized eager program (the
        ``{method: GraphModule}`` that ``lower_vlm(..., quantized_reference=)`` fills, its weights expanded once,
        in copies); of a lowered program (``EdgeProgramManager`` or its ``to_executorch()``) or a ``.pte`` (path or
        bytes), run in ExecuTorch's runtime."""
        from coreai_partitioner.image_text_to_text.model import VisionLanguage

        if isinstance(program, dict):
            import copy

            from coreai_partitioner.text_decoder.decoder import reset_state
            from coreai_partitioner.quantize.weight_forms import expand_weights

            modules = {method: expand_weights(copy.deepcopy(module)) for method, module in program.items()}

            def quantized(method: str, *inputs: torch.Tensor) -> torch.Tensor:
                with torch.no_grad():
                    return modules[method](*inputs)

            def reset() -> None:
                for module in modules.values():
                    reset_state(module)

            return cls(quantized, reset)
        if isinstance(program, VisionLanguage):
            from coreai_partitioner.text_decoder.decoder import reset_state

            def eager(method: str, *inputs: torch.Tensor) -> torch.Tensor:
                with torch.no_grad():
                    return getattr(program, method)(*inputs)

            return cls(eager, lambda: reset_state(program))
        from coreai_partitioner import verify

        return cls(lambda method, *inputs: verify.run(program, *inputs, method=method)[0], lambda: verify.reset_state(program))


def greedy(program: Any, segments: Sequence[Segment], new_tokens: int, eos_ids: Sequence[int] = ()) -> list[int]:
    """The new tokens ``program`` generates greedily after ``segments``, as ``MultimodalRunner`` calls it.

    Each segment is one ``text_decoder`` call at the next positions; each new
    token is ``token_embedding`` then ``text_decoder`` at one position.
    Stops after an EOS id.
    """
    methods = program if isinstance(program, Methods) else Methods.of(program)
    methods.reset()
    position = 0
    logits = None
    for segment in segments:
        logits, position = prefill(methods, segment, position)
    tokens: list[int] = []
    for _ in range(new_tokens):
        token = int(logits.reshape(-1, logits.shape[-1])[-1].argmax())
        tokens.append(token)
        if token in eos_ids:
            break
        embedded = methods.call("token_embedding", torch.tensor([[token]]))
        logits = methods.call("text_decoder", embedded, torch.tensor([position]))
        position += 1
    return tokens


def prefill(methods: Methods, segment: Segment, position: int) -> tuple[torch.Tensor, int]:
    """One segment's ``text_decoder`` call at ``position``: its logits and the next position."""
    if segment.is_image:
        embedded = methods.call("vision_encoder", segment.pixels.unsqueeze(0))
    else:
        embedded = methods.call("token_embedding", torch.tensor([segment.tokens]))
    length = embedded.shape[1]
    return methods.call("text_decoder", embedded, torch.arange(position, position + length)), position + length


def generate(
    pte: str | os.PathLike, tokenizer: str | os.PathLike, segments: Sequence[Segment], new_tokens: int
) -> list[str]:
    """ExecuTorch's own ``MultimodalRunner`` on ``pte`` (Core AI delegates on the host backend; with the ``.ptd``
    beside it, if any): its greedy output after ``segments``, one piece per generated token, the first being the
    prefill's."""
    from coreai_partitioner.backends.apple_coreai.runtime.host import load_runtime_backend
    from coreai_partitioner.backends.apple_coreai.runtime.pte import data_file_of
    from coreai_partitioner.console import NativeStreams

    with NativeStreams():
        from executorch.extension.llm.runner import GenerationConfig, MultimodalRunner, make_image_input, make_token_input

    load_runtime_backend()
    inputs = [make_image_input(s.pixels) if s.is_image else make_token_input(list(s.tokens)) for s in segments]
    pieces: list[str] = []
    streams = NativeStreams()
    try:
        with streams:
            data = data_file_of(pte)  # a program lowered with external_data runs with its .ptd
            runner = MultimodalRunner(str(pte), str(tokenizer), str(data)) if data else MultimodalRunner(str(pte), str(tokenizer))
            runner.generate(inputs, GenerationConfig(max_new_tokens=new_tokens, temperature=0.0, echo=False), pieces.append)
    except RuntimeError as error:
        raise RuntimeError(f"MultimodalRunner failed on {Path(pte).name}: {error}\n{streams.tail()}") from error
    return pieces
