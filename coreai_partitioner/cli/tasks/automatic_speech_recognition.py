"""Export a Hugging Face speech recognition checkpoint (Whisper) to a .pte for ExecuTorch's ASR runner.

    python -m coreai_partitioner export --checkpoint path/to/whisper --out out/model.pte --verify --transcribe speech.wav
    python -m coreai_partitioner export --checkpoint path/to/whisper --target device --dtype fp16 --out out/model.pte
    python -m coreai_partitioner export --checkpoint path/to/whisper --target device --dtype fp16 --encoder-dtype fp32
    python -m coreai_partitioner export --config whisper --verify          # a tiny random Whisper

The .pte has the methods ExecuTorch's ASR runner (``extension/asr/runner``)
calls: ``encoder(features [1, n_mels, 3000] fp32)``, whose one output is the
utterance's cross-attention keys and values, and ``text_decoder(ids [1, 1]
int64, encoder output, cache_position [1] int64) -> logits [1, 1, vocab]``,
one token a call over static self-attention caches; both Core AI delegates,
functions of one asset (each weight stored once), plus constant methods
(``get_eos_ids``, ``decoder_start_token_id``, ``get_max_seq_len``).  Beside
it: ``tokenizer.json`` (checked with ExecuTorch's runner tokenizers first),
``preprocessor_config.json`` (the log-mel's settings: n_mels, hop, chunk
length) and ``generation_config.json`` (the decoder prompt and the
suppressed tokens).  ``--target device`` is the form upstream's on-device Core
AI runtime runs (``CoreAIBackend``, fp16/fp32 tensors only, caches owned by
ExecuTorch).  ``--encoder-dtype fp32`` under ``--dtype fp16`` computes the encoder (and
the cross-attention keys and values) in fp32, once per utterance, and the
decoder in fp16.  ``--verify`` judges the encoder's output, the first logits and
the greedy ids against the Hugging Face model at those dtypes before keeping
the .pte, fp32's beside them as a report (on ``--transcribe``'s recording, or
a seeded noise).  ``--transcribe`` reads a
16 kHz mono wav of at most 30 s and prints its text, through ExecuTorch's
runtime.  Nothing is downloaded.  Needs the hf extra.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner import console
from coreai_partitioner.cli.command import CommandError
from coreai_partitioner.cli.detect import Detection, Head
from coreai_partitioner.cli.flags import DTYPES
from coreai_partitioner.cli.task import Phases, Plan, checkpoint_generation, describe_encoder_decoder, describe_tokenizer, partitioner_options

NAME = "automatic-speech-recognition"
DETECT = Detection(takes="Whisper", heads=(Head(prefix="Whisper"), Head("ForSpeechSeq2Seq")), model_types=("whisper",))
MODEL = "AutoModelForSpeechSeq2Seq"
RUNNER = "ExecuTorch's ASR runner (and --transcribe)"
FLAGS = ("--max-context-len",)
DEFAULTS = {"config": "whisper"}

#: Decode length of ``--verify`` (the noise it runs on otherwise decodes to the cache's end).
VERIFY_TOKENS = 24


def tiny_configs() -> list[str]:
    from coreai_partitioner.speech_recognition.tiny import NAME

    return [NAME]


def tiny_config(name: str) -> Any:
    from coreai_partitioner.speech_recognition.tiny import tiny_config

    return tiny_config()


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--encoder-dtype",
        choices=tuple(DTYPES),
        help="what encoder computes in (default --dtype), at least as wide: the encoder and the cross-attention keys and "
        "values, once per utterance; its output is cast to --dtype, the decoder's. fp32 under an fp16 decoder keeps "
        "fp16's long accumulations out of the encoder (docs/speech.md)",
    )
    parser.add_argument("--transcribe", type=Path, metavar="WAV", help="print the text of a 16 kHz mono wav of at most 30 s")
    parser.add_argument("--language", default="en", help="the decoder prompt's language (a multilingual model's)")
    parser.add_argument(
        "--speech-task",
        choices=("transcribe", "translate"),
        default="transcribe",
        help="the decoder prompt's task: transcribe in --language, or translate to English (the export command's own "
        "--task names the task it exports)",
    )


def refusals() -> tuple[type[Exception], ...]:
    from coreai_partitioner.blocks.errors import UnsupportedConfig
    from coreai_partitioner.text_decoder.tokenizer import TokenizerError
    from coreai_partitioner.speech_recognition import AudioError, DecodingError, UnsupportedSpeechModel

    return UnsupportedSpeechModel, UnsupportedConfig, TokenizerError, AudioError, DecodingError


# ---------------------------------------------------------------- before any export work


@dataclass
class SpeechPlan(Plan):
    settings: Any = None  # speech_recognition.FeatureSettings
    decoding: Any = None  # transformers.GenerationConfig: what the model carries, and written beside the .pte
    rules: Any = None  # speech_recognition.DecodingRules
    audio: Any = None  # the --transcribe recording's samples, or None

    @property
    def encoder_dtype(self) -> torch.dtype:
        return DTYPES[self.args.encoder_dtype or self.args.dtype]

    @property
    def load_dtype(self) -> torch.dtype:
        """The weights are loaded at the wider of the two dtypes, each part cast down from them."""
        return max(self.dtype, self.encoder_dtype, key=lambda dtype: torch.finfo(dtype).bits)

    @property
    def generation(self) -> Any:
        return self.decoding

    @property
    def precision(self) -> str:
        return self.args.dtype + ("" if self.encoder_dtype == self.dtype else f", encoder {self.args.encoder_dtype}")


def settle(args: argparse.Namespace, config: Any) -> SpeechPlan:
    """The checkpoint's task and model, the cache length, the dtypes, the recording, the decoding rules."""
    from coreai_partitioner.speech_recognition import DecodingRules, FeatureSettings, read_wav

    generation = generation_config(args, config)
    if args.max_context_len is not None and not 1 <= args.max_context_len <= config.max_target_positions:
        raise CommandError(
            f"--max-context-len {args.max_context_len}: {config.model_type} has {config.max_target_positions} decoder "
            f"positions; give 1 to {config.max_target_positions}"
        )
    if args.encoder_dtype is not None and torch.finfo(DTYPES[args.encoder_dtype]).bits < torch.finfo(DTYPES[args.dtype]).bits:
        raise CommandError(
            f"--encoder-dtype {args.encoder_dtype} under --dtype {args.dtype}: the encoder may be wider than the decoder, "
            "not narrower (it runs once per utterance, the decoder once per token, and fp16 changes the encoder's "
            f"output most: docs/speech.md); give --dtype {args.encoder_dtype} to compute both in {args.encoder_dtype}"
        )
    settings = FeatureSettings.read(args.checkpoint, n_mels=config.num_mel_bins) if args.checkpoint else FeatureSettings(n_mels=config.num_mel_bins)
    if settings.n_mels != config.num_mel_bins:
        raise CommandError(
            f"{args.checkpoint}: preprocessor_config.json has feature_size {settings.n_mels}, the model "
            f"num_mel_bins {config.num_mel_bins}; give the checkpoint its own feature extractor settings"
        )
    audio = read_wav(args.transcribe, settings) if args.transcribe is not None else None
    rules = DecodingRules.of(generation, language=args.language, task=args.speech_task)
    return SpeechPlan(args, config, settings=settings, decoding=generation, rules=rules, audio=audio)


def generation_config(args: argparse.Namespace, config: Any) -> Any:
    """The generation config to export, the config refused up front if it is not a speech model's."""
    from coreai_partitioner.speech_recognition.tiny import tiny_generation_config

    if not args.checkpoint:
        return tiny_generation_config(config)
    if config.model_type != "whisper":
        raise CommandError(f"{args.checkpoint}: {config.model_type} is not exported for {NAME}; this command exports whisper")
    return checkpoint_generation(args.checkpoint, config)


def dry_run(plan: SpeechPlan) -> None:
    """What would be exported, from the config alone."""
    config, args = plan.config, plan.args
    slots = args.max_context_len or config.max_target_positions
    print(f"{config.model_type}: {config.encoder_layers} + {config.decoder_layers} layers, {plan.precision}, {args.target} form")
    print(f"  encoder(features [1, {config.num_mel_bins}, 3000]) -> cross-attention keys and values")
    print(f"  text_decoder(ids [1, 1], cross, cache_position [1]) -> logits [1, 1, {config.vocab_size}]; {slots} cache slots")
    print(f"  decoder prompt: {args.speech_task}" + (f" ({args.language})" if args.speech_task == "transcribe" else " to English"))
    print(f"  tokenizer: {describe_tokenizer(plan)}")
    print(f"  would write {args.out}")


# ---------------------------------------------------------------- export


def verify_features(plan: SpeechPlan) -> torch.Tensor:
    """``--verify``'s input: the recording's features, or 3 s of seeded noise's."""
    import numpy as np

    from coreai_partitioner.speech_recognition import log_mel

    audio = plan.audio
    if audio is None:
        audio = 0.1 * np.random.default_rng(0).standard_normal(3 * plan.settings.sampling_rate).astype(np.float32)
    return log_mel(audio, plan.settings)


def reference(plan: SpeechPlan, model: torch.nn.Module) -> Any:
    from coreai_partitioner.speech_recognition.check import reference

    args = plan.args
    return reference(model, verify_features(plan), language=args.language, task=args.speech_task, max_new_tokens=VERIFY_TOKENS)


def lower(plan: SpeechPlan, model: torch.nn.Module, phases: Phases) -> tuple[Any, Any]:
    """The encoder and text_decoder lowered at their dtypes; under ``--verify`` Hugging Face's model at them, the
    ``.pte``'s judge (``None`` at fp32: the reference's)."""
    from coreai_partitioner.speech_recognition import adapt, at_precision, lower_speech

    cast = not plan.dtype == plan.encoder_dtype == torch.float32
    if cast:
        with phases("cast"):
            model = at_precision(model, plan.dtype, encoder_dtype=plan.encoder_dtype)
    speech = adapt(model, plan.args.max_context_len)
    lowered = lower_speech(model, target=plan.args.target, speech=speech, phases=phases.seconds, **partitioner_options(plan.args))
    return lowered, (model if cast and plan.args.verify else None)


def eager(plan: SpeechPlan, lowered: Any, lowered_from: torch.nn.Module, verified: Any) -> Any:
    """Hugging Face's outputs at the program's dtypes: the reference's steps on the model the ``.pte`` is lowered
    from."""
    return reference(plan, lowered_from)


def describe(plan: SpeechPlan, model: torch.nn.Module, pte: Any) -> None:
    config = model.config
    slots = plan.args.max_context_len or config.max_target_positions
    print(f"{type(model).__name__} ({config.model_type}): {config.encoder_layers} + {config.decoder_layers} layers, "
          f"{plan.precision}, {plan.args.target} form")
    describe_encoder_decoder(pte, f"features [1, {config.num_mel_bins}, 3000]", config.vocab_size, slots)


def check(plan: SpeechPlan, path: Path, verified: Any, eager: Any) -> Any:
    from coreai_partitioner.speech_recognition import SpeechProgram
    from coreai_partitioner.speech_recognition.check import check

    return check(SpeechProgram(path), verified, eager=eager if eager is not None else verified, dtype=plan.dtype,
                 max_new_tokens=VERIFY_TOKENS)


def companions(plan: SpeechPlan, directory: Path) -> list[Path]:
    """``tokenizer.json`` (and its companions), ``preprocessor_config.json``, ``generation_config.json``."""
    from coreai_partitioner.text_decoder import tokenizer
    from coreai_partitioner.speech_recognition.tiny import tiny_tokenizer

    if plan.tokenizer is not None:
        written = tokenizer.copy(plan.tokenizer, directory)
    else:
        written = [directory / "tokenizer.json"]
        tiny_tokenizer().save(str(written[0]))
    written.append(plan.settings.write(directory))
    plan.decoding.save_pretrained(directory)
    written.append(directory / "generation_config.json")
    return written


# ---------------------------------------------------------------- running the .pte


def after(plan: SpeechPlan) -> None:
    """``--transcribe``: the recording through the written .pte in ExecuTorch's runtime, its text printed."""
    from coreai_partitioner.speech_recognition import SpeechProgram, log_mel

    if plan.audio is None:
        return
    with console.NativeStreams():
        program = SpeechProgram(plan.args.out)
        decoded = program.decode(log_mel(plan.audio, plan.settings), plan.rules)
    seconds = len(plan.audio) / plan.settings.sampling_rate
    print(f"\ntranscribe {plan.args.transcribe.name} ({seconds:.1f} s): {program.text(decoded.ids)!r}")
    total = decoded.encoder_seconds + decoded.prompt_seconds + decoded.decode_seconds
    print(f"  encoder {decoded.encoder_seconds:.1f} s; {len(decoded.ids)} token(s), {1000 * decoded.seconds_per_token:.0f} ms "
          f"per text_decoder call; real-time factor {total / seconds:.2f}")
