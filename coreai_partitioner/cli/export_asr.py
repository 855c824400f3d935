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
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner import console
from coreai_partitioner.cli.command import CommandError, run_command

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}

#: The task this command exports (optimum's name), as ``cli/export.py``'s ``task_of`` reads it off a config.
TASK = "automatic-speech-recognition"

#: Decode length of ``--verify`` (the noise it runs on otherwise decodes to the cache's end).
VERIFY_TOKENS = 24


def tiny_configs() -> list[str]:
    """The ``--config`` names (``python -m coreai_partitioner export`` asks)."""
    from coreai_partitioner.speech.tiny import NAME

    return [NAME]


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", choices=tiny_configs(), help="a tiny random model")
    source.add_argument("--checkpoint", type=Path, help="a local Hugging Face checkpoint directory")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument(
        "--encoder-dtype",
        choices=tuple(DTYPES),
        help="what encoder computes in (default --dtype), at least as wide: the encoder and the cross-attention keys and "
        "values, once per utterance; its output is cast to --dtype, the decoder's. fp32 under an fp16 decoder keeps "
        "fp16's long accumulations out of the encoder (docs/speech.md)",
    )
    parser.add_argument(
        "--target",
        choices=("host", "device"),
        default="host",
        help="host: this package's runtime (caches as delegate state); device: upstream's on-device Core AI runtime "
        "(CoreAIBackend, fp16/fp32 tensors only, caches owned by ExecuTorch)",
    )
    parser.add_argument("--max-decode-len", type=int, help="self-attention cache slots (default the model's max_target_positions)")
    parser.add_argument("--out", type=Path, default=Path("model.pte"))
    parser.add_argument("--verify", action="store_true", help="judge the .pte against Hugging Face eager at --dtype (and --encoder-dtype) before keeping it")
    parser.add_argument("--transcribe", type=Path, metavar="WAV", help="print the text of a 16 kHz mono wav of at most 30 s")
    parser.add_argument("--language", default="en", help="the decoder prompt's language (a multilingual model's)")
    parser.add_argument("--task", dest="speech_task", choices=("transcribe", "translate"), default="transcribe")
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
    config: Any
    settings: Any  # speech.FeatureSettings
    generation: Any  # transformers.GenerationConfig: written beside the .pte
    rules: Any  # speech.DecodingRules
    tokenizer: Any  # llm.tokenizer.Tokenizer or None (a tiny config's is made)
    audio: Any  # the --transcribe recording's samples, or None

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.args.dtype]

    @property
    def encoder_dtype(self) -> torch.dtype:
        return DTYPES[self.args.encoder_dtype or self.args.dtype]

    @property
    def load_dtype(self) -> torch.dtype:
        """The weights are loaded at the wider of the two dtypes, each part cast down from them."""
        return max(self.dtype, self.encoder_dtype, key=lambda dtype: torch.finfo(dtype).bits)

    @property
    def precision(self) -> str:
        return self.args.dtype + ("" if self.encoder_dtype == self.dtype else f", encoder {self.args.encoder_dtype}")


def run(args: argparse.Namespace) -> None:
    from coreai_partitioner.blocks.errors import UnsupportedConfig
    from coreai_partitioner.decoder.tokenizer import TokenizerError
    from coreai_partitioner.speech import AudioError, DecodingError, UnsupportedSpeechModel

    try:
        plan = settle(args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        partial = args.out.with_name(args.out.name + ".partial")
        try:
            export(plan, partial)
        finally:
            partial.unlink(missing_ok=True)
    except (UnsupportedSpeechModel, UnsupportedConfig, TokenizerError, AudioError, DecodingError) as error:
        raise CommandError(str(error)) from None
    if plan.audio is not None:
        transcribe(plan)


def settle(args: argparse.Namespace) -> Plan:
    """Every check that needs no weights: the checkpoint's task and model, the recording, the tokenizer, the rules."""
    from coreai_partitioner.speech import FeatureSettings, DecodingRules, read_wav

    if args.checkpoint is None and args.config is None:
        args.config = tiny_configs()[0]
    config, generation = model_config(args)
    if args.max_decode_len is not None and not 1 <= args.max_decode_len <= config.max_target_positions:
        raise CommandError(
            f"--max-decode-len {args.max_decode_len}: {config.model_type} has {config.max_target_positions} decoder "
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
    return Plan(args, config, settings, generation, rules, choose_tokenizer(args), audio)


def model_config(args: argparse.Namespace) -> tuple[Any, Any]:
    """The config and generation config to export, refused up front if they are not a speech model's."""
    from transformers import AutoConfig, GenerationConfig

    from coreai_partitioner.cli.export import UnknownTask, task_of
    from coreai_partitioner.speech.tiny import tiny_config, tiny_generation_config

    if not args.checkpoint:
        config = tiny_config()
        return config, tiny_generation_config(config)
    path = args.checkpoint / "config.json"
    if not path.is_file():
        what = "no such directory" if not args.checkpoint.is_dir() else "no config.json in it"
        raise CommandError(f"--checkpoint {args.checkpoint}: {what}; give a local Hugging Face checkpoint directory")
    try:
        task = task_of(json.loads(path.read_text()), str(path))
    except (UnknownTask, json.JSONDecodeError) as error:
        raise CommandError(str(error)) from None
    if task != TASK:
        raise CommandError(
            f"--checkpoint {args.checkpoint} is a {task} checkpoint, not {TASK}; export it with "
            f"`python -m coreai_partitioner export --checkpoint {args.checkpoint}` (which picks its task)"
        )
    config = AutoConfig.from_pretrained(args.checkpoint, local_files_only=True)
    if config.model_type != "whisper":
        raise CommandError(f"{args.checkpoint}: {config.model_type} is not exported for {TASK}; this command exports whisper")
    try:
        generation = GenerationConfig.from_pretrained(args.checkpoint, local_files_only=True)
    except OSError:
        generation = GenerationConfig.from_model_config(config)
    return config, generation


def choose_tokenizer(args: argparse.Namespace):
    """The checkpoint's tokenizer, checked as ExecuTorch's runner loads it, before any export work."""
    from coreai_partitioner.llm import tokenizer

    if not args.checkpoint:
        return None
    found = tokenizer.find(args.checkpoint)
    if found is None:
        raise CommandError(
            f"{args.checkpoint} has no tokenizer.json; ExecuTorch's ASR runner and --transcribe need one: "
            "give the checkpoint Whisper's tokenizer.json"
        )
    return tokenizer.check(found)


# ---------------------------------------------------------------- export


def load_model(plan: Plan, dtype: torch.dtype) -> torch.nn.Module:
    """The checkpoint at ``dtype``; or the tiny config's seeded model, made in fp32 and cast."""
    from transformers import WhisperForConditionalGeneration
    from transformers.utils import logging as transformers_logging

    from coreai_partitioner.speech.tiny import tiny_model

    if not console.verbose():
        transformers_logging.disable_progress_bar()
    if plan.args.checkpoint:
        return WhisperForConditionalGeneration.from_pretrained(
            plan.args.checkpoint, dtype=dtype, local_files_only=True, attn_implementation="eager"
        ).eval()
    return tiny_model().to(dtype)


def verify_features(plan: Plan) -> torch.Tensor:
    """``--verify``'s input: the recording's features, or 3 s of seeded noise's."""
    import numpy as np

    from coreai_partitioner.speech import log_mel

    audio = plan.audio
    if audio is None:
        audio = 0.1 * np.random.default_rng(0).standard_normal(3 * plan.settings.sampling_rate).astype(np.float32)
    return log_mel(audio, plan.settings)


def export(plan: Plan, partial: Path) -> None:
    """Load, export, write ``partial``, verify it; then it becomes ``--out``, its files beside it."""
    from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte
    from coreai_partitioner.speech import adapt, at_precision, lower_speech
    from coreai_partitioner.speech.check import reference

    args = plan.args
    phases: dict[str, float] = {}
    verified = eager = None
    model = None
    if args.verify:
        start = time.perf_counter()
        model = load_model(plan, torch.float32)
        features = verify_features(plan)
        verified = eager = reference(model, features, language=args.language, task=args.speech_task,
                                     max_new_tokens=VERIFY_TOKENS)
        if plan.load_dtype != torch.float32:
            model = None
        phases["fp32 reference"] = time.perf_counter() - start
    start = time.perf_counter()
    if model is None:
        model = load_model(plan, plan.load_dtype)
    at_fp32 = plan.dtype == plan.encoder_dtype == torch.float32
    if not at_fp32:
        model = at_precision(model, plan.dtype, encoder_dtype=plan.encoder_dtype)
    phases["load"] = time.perf_counter() - start
    if args.verify and not at_fp32:
        start = time.perf_counter()  # the eager model the .pte is lowered from is what it is judged against
        eager = reference(model, features, language=args.language, task=args.speech_task, max_new_tokens=VERIFY_TOKENS)
        phases[f"reference ({plan.precision})"] = time.perf_counter() - start
    speech = adapt(model, args.max_decode_len)
    lowered = lower_speech(model, target=args.target, speech=speech, phases=phases)
    start = time.perf_counter()
    with open(partial, "wb") as file:
        lowered.to_executorch().write_to_file(file)
    del lowered
    phases["write"] = time.perf_counter() - start

    pte = read_pte(partial)
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    config = model.config
    print(f"{type(model).__name__} ({config.model_type}): {config.encoder_layers} + {config.decoder_layers} layers, "
          f"{plan.precision}, {args.target} form")
    print(f"  methods: {', '.join(pte.methods)}")
    print(f"  encoder(features [1, {speech.n_mels}, 3000]) -> cross {list(speech.cross_shape)}: "
          f"{len(pte.coreai_delegates('encoder'))} Core AI delegate")
    print(f"  text_decoder(ids [1, 1], cross, cache_position [1]) -> logits [1, 1, {config.vocab_size}]: "
          f"{len(pte.coreai_delegates('text_decoder'))} Core AI delegate; {speech.decoder.max_decode_len} cache slots")
    print(f"  .pte {pte.size:,} bytes, weights {weights:,} bytes ({pte.size / weights:.3f}x)")
    print("  seconds: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items()))
    del model
    directory = args.out.parent
    if verified is not None:
        verify_pte(plan, partial, verified, eager)
    partial.replace(args.out)
    written = write_companions(plan, directory)
    print(f"wrote {args.out} and {', '.join(p.name for p in written)}")


def write_companions(plan: Plan, directory: Path) -> list[Path]:
    """``tokenizer.json`` (and its companions), ``preprocessor_config.json``, ``generation_config.json``."""
    from coreai_partitioner.llm import tokenizer
    from coreai_partitioner.speech.tiny import tiny_tokenizer

    if plan.tokenizer is not None:
        written = tokenizer.copy(plan.tokenizer, directory)
    else:
        written = [directory / "tokenizer.json"]
        tiny_tokenizer().save(str(written[0]))
    written.append(plan.settings.write(directory))
    plan.generation.save_pretrained(directory)
    written.append(directory / "generation_config.json")
    return written


def verify_pte(plan: Plan, pte: Path, verified, eager) -> None:
    """Print the .pte's report against HF eager at its dtype (and fp32's, a report); a .pte that falls short is not kept."""
    from coreai_partitioner.speech import SpeechProgram
    from coreai_partitioner.speech.check import check

    start = time.perf_counter()
    with console.NativeStreams():
        report = check(SpeechProgram(pte), verified, eager=eager, dtype=plan.dtype, max_new_tokens=VERIFY_TOKENS)
    print(f"\n{report}\n  ({time.perf_counter() - start:.1f} s)")
    if not report.ok:
        raise CommandError(f"the .pte is not close enough to the Hugging Face model it was lowered from; {plan.args.out} not written")


def transcribe(plan: Plan) -> None:
    """``--transcribe``: the recording through the written .pte in ExecuTorch's runtime, its text printed."""
    from coreai_partitioner.speech import SpeechProgram, log_mel

    with console.NativeStreams():
        program = SpeechProgram(plan.args.out)
        decoded = program.decode(log_mel(plan.audio, plan.settings), plan.rules)
    seconds = len(plan.audio) / plan.settings.sampling_rate
    print(f"\ntranscribe {plan.args.transcribe.name} ({seconds:.1f} s): {program.text(decoded.ids)!r}")
    total = decoded.encoder_seconds + decoded.prompt_seconds + decoded.decode_seconds
    print(f"  encoder {decoded.encoder_seconds:.1f} s; {len(decoded.ids)} token(s), {1000 * decoded.seconds_per_token:.0f} ms "
          f"per text_decoder call; real-time factor {total / seconds:.2f}")
