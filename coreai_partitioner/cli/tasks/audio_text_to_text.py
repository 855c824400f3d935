"""Export a Hugging Face audio-language model to one .pte for ExecuTorch's MultimodalRunner, with Core AI composites.

    python -m coreai_partitioner export --config voxtral --audio talk.wav --prompt "What is said?"   # tiny random model
    python -m coreai_partitioner export --checkpoint path/to/voxtral --dtype fp16 --out out/model.pte
    python -m coreai_partitioner export --checkpoint path/to/voxtral --num-layers 2 --audio-layers 2 --dry-run

(the task, ``audio-text-to-text``, is read off the checkpoint's config.)
The .pte has the three methods ExecuTorch's ``MultimodalRunner`` calls:
``audio_encoder(features [1, bins, frames]) -> [1, N, D]`` (one 30 s window
of the feature extractor's ``input_features``),
``token_embedding(tokens [1, n]) -> [1, n, D]`` and
``text_decoder(embeddings [1, S, D], positions [S]) -> logits``, S up to
``--prefill-chunk`` (a window's N embeddings, or a prompt segment, in one
call), each method one delegate and a function of one Core AI asset; plus
the runner's metadata methods.  Beside it: the tokenizer and
``preprocessor_config.json`` (the feature extractor's settings: what an app
computes the features with; the runner takes features).  ``--verify``
judges the ``.pte``'s greedy tokens over a recording (``--audio``, or a
seeded noise) against the eager model it was lowered from; ``--audio`` with
``--prompt`` runs the recording and the prompt through ``MultimodalRunner``
and prints the answer.  ``--config`` builds a tiny random model with a
one-character-per-token tokenizer.  Nothing is downloaded.  Needs the hf extra.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coreai_partitioner.cli.command import CommandError
from coreai_partitioner.cli.detect import Detection, Head
from coreai_partitioner.cli.task import Phases, Plan, describe_tokenizer, first_layers, partitioner_options, tokenizer_and_preprocessor, tokenizer_beside

NAME = "audio-text-to-text"
DETECT = Detection(
    takes="a *ForConditionalGeneration with an audio_config, or an audio-language family's model_type",
    heads=(Head("ForConditionalGeneration", key="audio_config"), Head("ForConditionalGeneration", model_type="granite_speech")),
    model_types=lambda: [*tiny_configs(), *not_lowered()],  # those it refuses, naming the part it does not lower
    own_refusal=lambda config: not_an_audio_language_model(config),
)
MODEL = "AutoModelForMultimodalLM"  # transformers 5 maps every audio-language model's head here
RUNNER = "MultimodalRunner"
FLAGS = ("--quantize", "--num-layers", "--max-context-len", "--prefill-chunk", "--no-tokenizer", "--new-tokens")
DEFAULTS: dict[str, Any] = {"new_tokens": 32}

#: The prompt ``--audio`` asks with when ``--prompt`` is left out.
DEFAULT_PROMPT = "What is said?"


def not_an_audio_language_model(config: Any) -> None:
    """Refuse a checkpoint of another task, or an audio-language model whose encoder or decoder is not lowered."""
    from coreai_partitioner.audio_text_to_text import family_of

    family_of(config)


def not_lowered() -> list[str]:
    from coreai_partitioner.audio_text_to_text.families import NOT_LOWERED

    return list(NOT_LOWERED)


def tiny_configs() -> list[str]:
    from coreai_partitioner.audio_text_to_text import supported

    return list(supported())


def tiny_config(name: str) -> Any:
    from coreai_partitioner.audio_text_to_text import tiny_config

    return tiny_config(name)


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--audio-layers", type=int, help="the audio tower's first N layers only (fast trials)")
    parser.add_argument(
        "--audio", type=Path,
        help="a 16 kHz mono PCM .wav: --verify's recording, and (with --prompt) asked about through MultimodalRunner",
    )
    parser.add_argument("--prompt", help=f"what --audio is asked (default: {DEFAULT_PROMPT!r})")


def refusals() -> tuple[type[Exception], ...]:
    from coreai_partitioner.audio_text_to_text import AudioTokensOverBound, UnsupportedAudio, UnsupportedAudioConfig, UnsupportedAudioModel
    from coreai_partitioner.quantize import QuantizationError
    from coreai_partitioner.text_decoder import UnsupportedConfig, UnsupportedModel, UnsupportedShapes
    from coreai_partitioner.text_decoder.device import UnsupportedDevice
    from coreai_partitioner.text_decoder.tokenizer import TokenizerError

    return (
        UnsupportedAudioModel, UnsupportedAudioConfig, UnsupportedAudio, AudioTokensOverBound, UnsupportedModel,
        UnsupportedConfig, UnsupportedShapes, UnsupportedDevice, QuantizationError, TokenizerError,
    )


# ---------------------------------------------------------------- before any export work


@dataclass
class AudioPlan(Plan):
    shapes: Any = None  # decoder.DecoderShapes of text_decoder
    family: Any = None  # the audio family module
    samples: np.ndarray | None = None  # --audio's samples (16 kHz mono)


def settle(args: argparse.Namespace, config: Any) -> AudioPlan:
    """Config and family, shapes, recording: all refused before any weights are read."""
    from coreai_partitioner.audio_text_to_text import check_config, family_of
    from coreai_partitioner.text_decoder import DecoderShapes

    family = family_of(config)
    config = first_layers(config, args)
    if args.audio_layers is not None:
        layers = config.audio_config.num_hidden_layers
        if not 1 <= args.audio_layers <= layers:
            raise CommandError(f"--audio-layers {args.audio_layers}: give 1 to {layers} (the tower's layers)")
        config.audio_config.num_hidden_layers = args.audio_layers
    if args.prompt is not None and args.audio is None:
        raise CommandError("--prompt asks about a recording: give it with --audio FILE.wav")
    tokens = family.audio_tokens(config)
    limit = getattr(config.get_text_config(), "max_position_embeddings", None) or 1024
    context = args.max_context_len or min(2 * tokens + 256, limit)
    chunk = args.prefill_chunk or min(tokens, context)
    try:
        shapes = DecoderShapes(context, chunk, "dynamic", args.target, verify_len=0)  # MultimodalRunner: no verify
    except ValueError as error:
        raise CommandError(str(error)) from None
    check_config(config, shapes)
    samples = read_recording(args.audio) if args.audio is not None else None
    return AudioPlan(args, config, shapes=shapes, family=family, samples=samples)


def read_recording(path: Path) -> np.ndarray:
    """``--audio``'s samples: a 16 kHz mono PCM wav of any length (split into 30 s windows as the processor splits it)."""
    from coreai_partitioner.audio_text_to_text import UnsupportedAudio
    from coreai_partitioner.speech_recognition.features import AudioError, FeatureSettings, read_wav

    try:
        return read_wav(path, FeatureSettings(chunk_length=10**6))  # any length: the windows are the processor's
    except AudioError as error:
        raise UnsupportedAudio(str(error)) from None


def dry_run(plan: AudioPlan) -> None:
    """What would be exported, from the config alone."""
    config, shapes = plan.config, plan.shapes
    bins, frames = plan.family.window(config)
    text = config.get_text_config()
    print(f"{config.model_type} (audio family {plan.family.__name__.rsplit('.', 1)[-1]}.py)")
    print(f"  audio_encoder(features [1, {bins}, {frames}]) -> [1, {plan.family.audio_tokens(config)}, D]; "
          f"a tower of {config.audio_config.num_hidden_layers} layer(s)")
    print(f"  token_embedding(tokens [1, n]) -> [1, n, D]; n 1..{shapes.prefill_chunk}")
    print(f"  text_decoder(embeddings [1, S, D], positions [S]) -> logits [1, 1, {text.vocab_size}]; S 1..{shapes.prefill_chunk}, "
          f"context {shapes.max_context_len}; a {text.model_type} decoder of {text.num_hidden_layers} layer(s)")
    print(f"  tokenizer: {describe_tokenizer(plan)}")
    print(f"  would write {plan.args.out}")


def tokenizer_of(plan: AudioPlan) -> Any:
    """The tokenizer the prompt is laid out with: the checkpoint's, or the tiny config's."""
    if not plan.args.checkpoint:
        return plan.family.tiny_processor(plan.config)[1]
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(plan.args.checkpoint, local_files_only=True)
    except (OSError, ValueError, ImportError) as error:
        raise CommandError(f"--verify and --audio need the checkpoint's tokenizer, which transformers cannot load: {error}") from None


def prompt_segments(plan: AudioPlan, text: str | None) -> tuple[torch.Tensor, list[int], list]:
    """``input_features`` (the windows, computed as an app computes them: :func:`log_mel_windows` with the
    checkpoint's feature settings), the prompt's ids and the runner's segments for ``--audio`` (a seeded noise
    without it) and ``text``."""
    from coreai_partitioner.audio_text_to_text.run import runner_inputs
    from coreai_partitioner.speech_recognition.features import FeatureSettings, log_mel_windows

    bins, _ = plan.family.window(plan.config)
    settings = FeatureSettings.read(plan.args.checkpoint, n_mels=bins) if plan.args.checkpoint else FeatureSettings(n_mels=bins)
    samples = plan.samples
    if samples is None:
        samples = (np.random.default_rng(0).standard_normal(16000 * 5) * 0.05).astype(np.float32)
    features = log_mel_windows(samples, settings)
    ids = plan.family.prompt_ids(tokenizer_of(plan), plan.config, features.shape[0], text or DEFAULT_PROMPT)
    segments = runner_inputs([ids], features, plan.config.audio_token_id, plan.family.audio_tokens(plan.config))
    return features, ids, segments


# ---------------------------------------------------------------- export


@dataclass(frozen=True)
class Reference:
    segments: list
    tokens: list[int]
    eos_ids: list[int]


def reference(plan: AudioPlan, model: torch.nn.Module) -> Reference:
    """The fp32 model's greedy tokens (HF ``generate``) over the recording and the prompt."""
    features, ids, segments = prompt_segments(plan, plan.args.prompt)
    generation = model.generation_config
    eos = generation.eos_token_id
    pad = generation.pad_token_id if generation.pad_token_id is not None else (eos if isinstance(eos, int) else 0)
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids]), input_features=features, max_new_tokens=plan.args.new_tokens, do_sample=False,
            pad_token_id=pad,
        )
    return Reference(segments, out[0, len(ids) :].tolist(), [eos] if isinstance(eos, int) else list(eos or []))


def lower(plan: AudioPlan, model: torch.nn.Module, phases: Phases) -> tuple[Any, Any]:
    """The three methods lowered; under ``--verify`` the eager methods they were lowered from where not fp32."""
    from coreai_partitioner.audio_text_to_text import adapt, lower_audio_language
    from coreai_partitioner.text_decoder.multimodal import Methods

    with phases("adapt"):
        alm = adapt(model, plan.shapes)
    quantized: dict = {}
    with phases("export and lower"):
        lowered = lower_audio_language(
            model, plan.shapes, alm=alm, quantize=plan.args.quantize, quantized_reference=quantized,
            **partitioner_options(plan.args),
        )
    if not plan.args.verify or (not quantized and plan.dtype == torch.float32):
        return lowered, None
    return lowered, Methods.of(quantized or alm)


def eager(plan: AudioPlan, lowered: Any, lowered_from: Any, verified: Reference) -> list[int]:
    """The eager methods' greedy tokens, fed as the runner feeds the ``.pte``."""
    from coreai_partitioner.text_decoder.multimodal import greedy

    return greedy(lowered_from, verified.segments, len(verified.tokens), eos_ids=verified.eos_ids)


def describe(plan: AudioPlan, model: torch.nn.Module, pte: Any) -> None:
    config, shapes = plan.config, plan.shapes
    bins, frames = plan.family.window(config)
    print(f"{type(model).__name__} ({config.model_type}): an audio tower of {config.audio_config.num_hidden_layers} "
          f"layer(s), a {config.get_text_config().model_type} decoder of {config.get_text_config().num_hidden_layers}, "
          f"{plan.args.dtype}")
    print(f"  methods: {', '.join(m for m in pte.methods)}")
    print(f"  a window [{bins}, {frames}] is {plan.family.audio_tokens(config)} embeddings; text_decoder takes 1 to "
          f"{shapes.prefill_chunk} a call, context {shapes.max_context_len}")
    hashes = {d.manifest["hash"] for d in pte.coreai_delegates()}
    print(f"  {len(pte.coreai_delegates())} Core AI delegate(s), {len(hashes)} asset")


@dataclass(frozen=True)
class TokenReport:
    picked: list[int]
    expected: list[int]
    against: str

    @property
    def ok(self) -> bool:
        return self.picked == self.expected

    def __str__(self) -> str:
        return f"verify: greedy tokens\n  .pte : {self.picked}\n  {self.against}: {self.expected}" + ("\n  same" if self.ok else "")


def check(plan: AudioPlan, path: Path, verified: Reference, eager: list[int] | None) -> TokenReport:
    """The ``.pte``'s greedy tokens, fed as the runner feeds it, against the eager model's it was lowered from."""
    from coreai_partitioner.text_decoder.multimodal import greedy

    expected = eager if eager is not None else verified.tokens
    picked = greedy(path, verified.segments, len(verified.tokens), eos_ids=verified.eos_ids)
    return TokenReport(picked, expected, "the eager model" if eager is not None else "the fp32 HF model")


def companions(plan: AudioPlan, directory: Path) -> list[Path]:
    """The tokenizer and the feature extractor's settings: what a caller needs besides the .pte."""

    def tiny() -> tuple[Any, Any]:
        extractor, tokenizer = plan.family.tiny_processor(plan.config)
        return tokenizer, extractor

    return tokenizer_and_preprocessor(
        plan, directory, tiny, "a caller must compute the log-mel features itself (the .pte's get_audio_window says their shape)"
    )


# ---------------------------------------------------------------- running the .pte


def after(plan: AudioPlan) -> None:
    """``--audio`` and ``--prompt`` through ExecuTorch's ``MultimodalRunner``, the answer as it comes."""
    from coreai_partitioner.audio_text_to_text.run import generate

    args = plan.args
    if args.audio is None:
        return
    _, _, segments = prompt_segments(plan, args.prompt)
    start = time.perf_counter()
    pieces = generate(args.out, tokenizer_beside(plan), segments, args.new_tokens)
    windows = sum(s.is_audio for s in segments)
    print(f"\n{args.audio.name} ({windows} window(s)), {args.prompt or DEFAULT_PROMPT!r} -> {''.join(pieces)!r}")
    print(f"  {len(segments)} segment(s), {len(pieces)} token(s) in {time.perf_counter() - start:.1f} s (MultimodalRunner)")
