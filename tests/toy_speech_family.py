"""A third text-to-speech family, defined outside the package: a toy whose durations come from an embedding of each id
and whose decoder spreads each token's embedding over its frames and mixes it to samples.  What a family module
defines is :mod:`coreai_partitioner.text_to_speech.families`'s docstring; registered with ``families.register``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from coreai_partitioner.text_to_speech.program import SpeechProgram, SpeechReference

NAME = "toy-speech"
CODE = 99
MODEL_TYPES = ("toy-speech",)
HEADS: tuple[str, ...] = ()
TAKES = "a toy speech model"
TITLE = "Toy speech"
LIMITS = (6, 24)
ID_FILES: tuple[str, ...] = ()
AGAINST = "the toy's eager forward at the same seed"


class Unsupported(ValueError):
    """Limits the toy cannot take."""


@dataclass
class ToyConfig:
    vocab_size: int = 10
    width: int = 4
    hop: int = 3
    model_type: str = "toy-speech"
    sampling_rate: int = 8000


class Durations(nn.Module):
    def __init__(self, model: "Toy") -> None:
        super().__init__()
        self.embedding, self.duration = model.embedding, model.duration

    def forward(self, ids: torch.Tensor, mask: torch.Tensor):
        embedded = self.embedding(ids)  # [1, T, W]
        durations = torch.ceil(torch.sigmoid(self.duration(embedded))[..., 0] * 3) * mask.to(embedded.dtype)
        return durations, embedded


class Frames(nn.Module):
    def __init__(self, model: "Toy") -> None:
        super().__init__()
        self.mix = model.mix

    def forward(self, durations: torch.Tensor, embedded: torch.Tensor, noise: torch.Tensor):
        frames = torch.arange(noise.shape[-1], dtype=durations.dtype).unsqueeze(0)  # [1, F]
        covered = (frames < torch.cumsum(durations, -1).unsqueeze(-1)).to(embedded.dtype)  # [1, T, F]
        path = covered - nn.functional.pad(covered, [0, 0, 1, 0])[:, :-1]
        spread = torch.matmul(path.transpose(1, 2), embedded).transpose(1, 2) + 0.1 * noise  # [1, W, F]
        return torch.tanh(self.mix(spread)).transpose(1, 2).reshape(1, -1)  # [1, F * hop]


class Toy(nn.Module):
    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.width)
        self.duration = nn.Linear(config.width, 1)
        self.mix = nn.Conv1d(config.width, config.hop, 1)

    def forward(self, ids: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        durations, embedded = Durations(self)(ids, torch.ones_like(ids))
        torch.manual_seed(seed)
        noise = torch.randn(1, self.config.width, int(durations.sum()))
        return Frames(self)(durations, embedded, noise)[0], durations[0]


def is_checkpoint(directory: Path) -> bool:
    return False


def load_config(checkpoint: Path) -> ToyConfig:
    raise Unsupported("the toy has no checkpoints")


def load_model(checkpoint: Path, config: ToyConfig, dtype: torch.dtype) -> nn.Module:
    raise Unsupported("the toy has no checkpoints")


def tiny_config() -> ToyConfig:
    return ToyConfig()


def tiny_model(config: ToyConfig) -> nn.Module:
    return Toy(config).eval()


def limits(config: ToyConfig, max_tokens: int | None, max_frames: int | None) -> tuple[int, int]:
    tokens, frames = max_tokens or LIMITS[0], max_frames or LIMITS[1]
    if frames < 3 * tokens:
        raise Unsupported(f"--max-frames {frames}: the toy's {tokens} tokens last up to {3 * tokens} frames")
    return tokens, frames


def layers(config: ToyConfig) -> str:
    return "no layers"


def methods(config: ToyConfig, max_tokens: int, max_frames: int) -> list[str]:
    return [f"durations(ids [1, {max_tokens}], mask)", f"decoder(durations, embedded, noise [1, {config.width}, F <= {max_frames}])"]


def seeded_reference(model: nn.Module, config: ToyConfig, max_tokens: int) -> SpeechReference:
    ids = torch.randint(0, config.vocab_size, (max_tokens - 1,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        waveform, durations = model(torch.tensor([ids]), seed=0)
    return SpeechReference(ids, 0, waveform, durations)


def lower(model: nn.Module, *, max_tokens: int, max_frames: int, device: bool, **partitioner_options: Any):
    from coreai_partitioner.lowering.methods import lower_method_modules

    config = model.config
    samples = {
        "durations": (torch.ones(1, max_tokens, dtype=torch.long), torch.ones(1, max_tokens, dtype=torch.long)),
        "decoder": (torch.ones(1, max_tokens), torch.zeros(1, max_tokens, config.width), torch.zeros(1, config.width, 4)),
    }
    dynamic_shapes = {"durations": None, "decoder": (None, None, {2: torch.export.Dim("F", min=1, max=max_frames)})}
    constants = {"get_family": CODE, "get_sampling_rate": config.sampling_rate, "get_max_tokens": max_tokens,
                 "get_width": config.width}
    return lower_method_modules(
        {"durations": Durations(model).eval(), "decoder": Frames(model).eval()}, samples, device=device,
        constant_methods=constants, dynamic_shapes=dynamic_shapes, **partitioner_options,
    )


def replay(program: SpeechProgram, verified: SpeechReference) -> tuple[torch.Tensor, torch.Tensor]:
    waveform, durations = run(program, verified.ids, verified.seed)
    return durations, waveform


def speak(program: SpeechProgram, ids: list[int], *, voice: Path | None, speed: float, seed: int) -> torch.Tensor:
    return run(program, ids, seed)[0]


def run(program: SpeechProgram, ids: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    padding = (0, program.constant("get_max_tokens") - len(ids))
    ids_tensor = torch.tensor([ids])
    mask = nn.functional.pad(torch.ones_like(ids_tensor), padding)
    durations, embedded = program.run("durations", nn.functional.pad(ids_tensor, padding), mask)
    torch.manual_seed(seed)
    noise = torch.randn(1, program.constant("get_width"), int(durations.sum()))
    return program.run("decoder", durations, embedded, noise)[0][0], durations[0, : len(ids)]
