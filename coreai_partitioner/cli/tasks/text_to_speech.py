"""Export a text-to-speech checkpoint to a .pte that speaks: ``durations`` and ``decoder``.

    python -m coreai_partitioner export --checkpoint path/to/mms-tts-eng --verify --out out/model.pte
    python -m coreai_partitioner export --checkpoint path/to/Kokoro-82M --verify --out out/kokoro.pte
    python -m coreai_partitioner export --config vits --verify --out out/model.pte      # a tiny random VITS
    python -m coreai_partitioner generate-speech out/model.pte --ids 0,19,0,45,0 --seed 0 --out speech.wav
    python -m coreai_partitioner generate-speech out/kokoro.pte --ids 50,83,54 --voice af_heart.pt --out speech.wav

Two families: transformers' ``VitsModel`` (MMS-TTS; a checkpoint whose
config names it) and Kokoro-82M (the ``kokoro`` package's ``KModel``; a
directory of its ``config.json``, with ``istftnet`` and ``plbert``, and its
``.pth``).  The .pte has two methods, split where the length becomes
data-dependent: ``durations`` with ``T`` fixed at ``--max-tokens`` (the ids
padded, a mask saying which are), and ``decoder`` with the frames ``F`` up to
``--max-frames`` (:mod:`coreai_partitioner.text_to_speech.vits`,
:mod:`coreai_partitioner.text_to_speech.kokoro`); one Core AI delegate each,
plus ``get_family``, ``get_sampling_rate`` and the loop's limits.
``generate-speech`` is the loop: it draws the noises as the model draws them
from ``--seed`` and writes a WAV at the model's sampling rate.  The app turns
text into ids (VITS: ``VitsTokenizer``'s ``vocab.json``; Kokoro: its G2P and
the ``vocab`` of ``config.json``; both copied beside the ``.pte``); a Kokoro
run takes a voice (``--voice``, one of Kokoro's ``voices/*.pt``).
``--verify`` judges the waveform and durations of seeded random ids against
the model itself at the same seed.  fp32, single speaker; ``--target device``
is the form upstream's on-device runtime runs (the ids and mask cross as fp32).
Nothing is downloaded.  Needs the hf extra (Kokoro: ``pip install --no-deps
kokoro==0.9.4 loguru``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.cli.command import CommandError
from coreai_partitioner.cli.detect import Detection, Head, UnknownTask, config_file
from coreai_partitioner.cli.task import Phases, Plan, copy_beside, partitioner_options


def is_kokoro(checkpoint: Path) -> bool:
    """A directory holding Kokoro's ``config.json`` (its ``istftnet`` and ``plbert`` sections)."""
    try:
        raw = json.loads((Path(checkpoint) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and "istftnet" in raw and "plbert" in raw


NAME = "text-to-speech"
DETECT = Detection(
    takes="a VitsModel (MMS-TTS) or a Kokoro-82M directory (KModel's config.json and .pth)",
    heads=(Head("VitsModel"),), model_types=("vits",), directory=is_kokoro,
)
MODEL = "VitsModel"
RUNNER = "this package's generate-speech loop (python -m coreai_partitioner generate-speech)"
FLAGS: tuple[str, ...] = ()
DEFAULTS: dict[str, Any] = {}
#: The files of a checkpoint an app needs to make the ids, copied beside the .pte: VITS's tokenizer, Kokoro's vocab.
ID_FILES = {"vits": ("vocab.json", "tokenizer_config.json", "special_tokens_map.json"), "kokoro": ("config.json",)}
#: How close the .pte's waveform is to the model's at the same seed, in fp32 (the issue's bound).
LEAST_SNR_DB = 40.0
#: ``--max-tokens`` and ``--max-frames`` where not given, per family: Kokoro's LSTMs are unrolled over both.
LIMITS = {"vits": (256, 4096), "kokoro": (128, 512)}


def family(config: Any) -> str:
    return "kokoro" if getattr(config, "model_type", None) == "kokoro" else "vits"


def tiny_configs() -> list[str]:
    from coreai_partitioner.text_to_speech.tiny import NAMES

    return list(NAMES)


def tiny_config(name: str) -> Any:
    from coreai_partitioner.text_to_speech.tiny import tiny_config

    return tiny_config(name)


def tiny_model(config: Any) -> Any:
    from coreai_partitioner.text_to_speech.tiny import tiny_model

    return tiny_model(config)


def load_config(checkpoint: Path) -> Any:
    """A Kokoro directory's config (its weights file found), or a VITS checkpoint's ``VitsConfig``."""
    if is_kokoro(checkpoint):
        from coreai_partitioner.text_to_speech.kokoro import read_config

        return read_config(checkpoint)
    from transformers import AutoConfig

    try:
        config_file(checkpoint)
    except UnknownTask as error:
        raise CommandError(str(error)) from None
    return AutoConfig.from_pretrained(checkpoint, local_files_only=True)


def load_model(plan: Plan, dtype: torch.dtype) -> torch.nn.Module:
    """Kokoro's ``KModel`` or transformers' ``VitsModel``, from the checkpoint or the tiny config, in fp32."""
    if not plan.args.checkpoint:
        return tiny_model(plan.config)
    if family(plan.config) == "kokoro":
        from coreai_partitioner.text_to_speech.kokoro import load_model as load_kokoro

        return load_kokoro(plan.config)
    from transformers import VitsModel

    return VitsModel.from_pretrained(plan.args.checkpoint, config=plan.config, dtype=dtype, local_files_only=True).eval()


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="the most token ids one call takes (default: VITS 256; Kokoro 128 or its ALBERT's positions, with "
                             "its two boundary ids)")
    parser.add_argument("--max-frames", type=int, default=None,
                        help="the most frames the decoder makes (default: VITS 4096, 65 s of MMS-TTS at 16 kHz; "
                             "Kokoro 512, 12.8 s at 24 kHz)")


def refusals() -> tuple[type[Exception], ...]:
    from coreai_partitioner.text_to_speech import UnsupportedVits
    from coreai_partitioner.text_to_speech.kokoro import UnsupportedKokoro

    return (UnsupportedVits, UnsupportedKokoro)


def settle(args: argparse.Namespace, config: Any) -> Plan:
    """A single-speaker VITS or a Kokoro, fp32, limits the decoder can take."""
    if args.dtype != "fp32":
        raise CommandError(
            f"--dtype {args.dtype}: text-to-speech exports fp32 (a duration is a rounding of the predictor's output, "
            "which fp16's rounding can move by a frame, and the waveform's length with it); leave out --dtype"
        )
    which = family(config)
    tokens, frames = LIMITS[which]
    if which == "kokoro":
        from coreai_partitioner.text_to_speech.kokoro import check_config

        check_config(config)
        context = config.plbert["max_position_embeddings"]
        tokens = min(tokens, context)
    args.max_tokens = tokens if args.max_tokens is None else args.max_tokens
    args.max_frames = frames if args.max_frames is None else args.max_frames
    if which == "kokoro":
        if not 3 <= args.max_tokens <= context or args.max_frames < 2:
            raise CommandError(
                f"--max-tokens {args.max_tokens} --max-frames {args.max_frames}: Kokoro takes 3 to {context} tokens "
                "(its ALBERT's positions) and at least 2 frames"
            )
    else:
        from coreai_partitioner.text_to_speech.vits import check_config

        check_config(config)
        if args.max_tokens < 1 or args.max_frames < 5:
            raise CommandError(f"--max-tokens {args.max_tokens} --max-frames {args.max_frames}: give at least 1 and 5")
    return Plan(args, config, runner_tokenizer=False)


def dry_run(plan: Plan) -> None:
    config, args = plan.config, plan.args
    if family(config) == "kokoro":
        print(f"Kokoro (KModel): {config.n_layer} layer(s), fp32, {args.target} form, {config.sampling_rate} Hz")
        print(f"  durations(input_ids [1, {args.max_tokens}], attention_mask, style [1, 256], speed [1])")
        print(f"  decoder(durations, prosody, text, style, phases, noise [1, F <= {args.max_frames}, ...]) -> waveform")
    else:
        from coreai_partitioner.text_to_speech.vits import hop_length

        print(f"VitsModel (vits): {config.num_hidden_layers} text-encoder layer(s), fp32, {args.target} form, {config.sampling_rate} Hz")
        print(f"  durations(input_ids [1, {args.max_tokens}], attention_mask, duration_noise [1, 2, {args.max_tokens}])")
        print(f"  decoder(durations, prior_means, prior_log_variances, noise [1, {config.flow_size}, F <= {args.max_frames}]) "
              f"-> waveform [1, F * {hop_length(config)}]")
    print(f"  would write {args.out}")


# ---------------------------------------------------------------- export


@dataclass(frozen=True)
class SpeechReference:
    """The model's own forward on seeded random ids at a seed (Kokoro's in a seeded random voice): its waveform and
    per-token durations."""

    ids: list[int]
    seed: int
    waveform: torch.Tensor
    durations: torch.Tensor
    style: torch.Tensor | None = None


def reference(plan: Plan, model: torch.nn.Module) -> SpeechReference:
    generator = torch.Generator().manual_seed(1)
    if family(plan.config) == "kokoro":
        from coreai_partitioner.text_to_speech.kokoro import reference

        ids = torch.randint(1, plan.config.n_token, (min(plan.args.max_tokens - 2, 16),), generator=generator).tolist()
        style = torch.randn(1, 256, generator=generator)
        return SpeechReference(ids, 0, *reference(model, ids, style, seed=0), style=style)
    from coreai_partitioner.text_to_speech.vits import reference

    ids = torch.randint(0, model.config.vocab_size, (min(plan.args.max_tokens, 16),), generator=generator).tolist()
    return SpeechReference(ids, 0, *reference(model, ids, seed=0))


def lower(plan: Plan, model: torch.nn.Module, phases: Phases) -> tuple[Any, Any]:
    """The family's methods lowered; ``None``: the reference (the fp32 model's waveform) is the ``.pte``'s judge."""
    from coreai_partitioner.text_to_speech.kokoro import lower_kokoro
    from coreai_partitioner.text_to_speech.vits import lower_vits

    lower_family = lower_kokoro if family(plan.config) == "kokoro" else lower_vits
    with phases("export and lower"):
        lowered = lower_family(
            model, max_tokens=plan.args.max_tokens, max_frames=plan.args.max_frames,
            device=plan.args.target == "device", **partitioner_options(plan.args),
        )
    return lowered, None


def describe(plan: Plan, model: torch.nn.Module, pte: Any) -> None:
    name = "Kokoro (KModel)" if family(plan.config) == "kokoro" else "VitsModel (vits)"
    print(f"{name}: fp32, {plan.args.target} form, {plan.config.sampling_rate} Hz")
    print(f"  methods: {', '.join(pte.methods)}")
    for method in ("durations", "decoder"):
        print(f"  {method}: {len(pte.coreai_delegates(method))} Core AI delegate(s)")


@dataclass(frozen=True)
class SpeechReport:
    """The .pte's durations and waveform against the model's at the same ids and seed."""

    durations_equal: bool
    snr_db: float
    samples: tuple[int, int]  # the .pte's, the model's
    against: str = "VitsModel's forward at the same seed"

    @property
    def ok(self) -> bool:
        return self.durations_equal and self.samples[0] == self.samples[1] and self.snr_db >= LEAST_SNR_DB

    def __str__(self) -> str:
        return (
            f"verify: seeded random ids through durations and decoder against {self.against}, the check:\n"
            f"  durations {'equal' if self.durations_equal else 'DIFFER'}; {self.samples[0]} samples "
            f"(the model: {self.samples[1]}); SNR {self.snr_db:.1f} dB (at least {LEAST_SNR_DB:.0f})"
            f" {'ok' if self.ok else 'FAILED'}"
        )


def check(plan: Plan, path: Path, verified: SpeechReference, eager: Any) -> SpeechReport:
    from coreai_partitioner.text_to_speech import SpeechProgram
    from coreai_partitioner.verify.fidelity import snr_psnr

    program = SpeechProgram(path)
    if family(plan.config) == "kokoro":
        from coreai_partitioner.text_to_speech import kokoro

        durations = kokoro.durations_of(program, verified.ids, verified.style)
        waveform = kokoro.synthesize(program, verified.ids, verified.style, seed=verified.seed)
        against = "KModel.forward_with_tokens at the same seed and voice"
    else:
        from coreai_partitioner.text_to_speech import vits

        durations = vits.durations_of(program, verified.ids, seed=verified.seed)
        waveform = vits.synthesize(program, verified.ids, seed=verified.seed)
        against = SpeechReport.against
    expected = verified.waveform
    snr = snr_psnr(waveform, expected)[0] if waveform.shape == expected.shape else float("-inf")
    return SpeechReport(torch.equal(durations, verified.durations), snr, (waveform.numel(), expected.numel()), against)


def companions(plan: Plan, directory: Path) -> list[Path]:
    """The checkpoint's files the app makes ids with (VITS's ``vocab.json``...; Kokoro's ``config.json``, its vocab)."""
    if not plan.args.checkpoint:
        return []
    return [copy_beside(plan.args.checkpoint / name, directory) for name in ID_FILES[family(plan.config)]
            if (plan.args.checkpoint / name).is_file()]


def after(plan: Plan) -> None:
    """Nothing: ``generate-speech`` runs the .pte."""


# ---------------------------------------------------------------- generate-speech


def add_generate_command(commands: Any) -> None:
    """``generate-speech PTE --ids ... [--voice V] [--seed N] [--out speech.wav]``, a subcommand of
    ``python -m coreai_partitioner``."""
    parser = commands.add_parser("generate-speech", help="run a text-to-speech .pte (export's text-to-speech task) and write a WAV")
    parser.add_argument("pte", type=Path)
    parser.add_argument("--ids", required=True, type=ids_of,
                        help="the token ids, comma-separated (12,5,33,...); Kokoro's are phoneme ids of its vocab, the "
                             "boundary 0s added as KModel adds them")
    parser.add_argument("--voice", type=Path, help="Kokoro: the voice, one of its voices/*.pt (a style per length)")
    parser.add_argument("--speed", type=float, default=1.0, help="Kokoro: the speaking rate (default 1)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the noises' seed: the waveform the model gives after torch.manual_seed(SEED)")
    parser.add_argument("--out", type=Path, default=Path("speech.wav"))
    parser.set_defaults(run=generate_speech)


def ids_of(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give token ids as integers separated by commas (12,5,33)") from None


def generate_speech(args: argparse.Namespace) -> int:
    """The family's loop and the WAV; 2 for ids, a voice or a .pte it refuses."""
    import sys

    from coreai_partitioner import console
    from coreai_partitioner.text_to_speech import SpeechProgram, kokoro, vits, write_wav

    try:
        with console.NativeStreams():  # the Core AI runtime's own lines as it loads each function
            program = SpeechProgram(args.pte)
            if program.family == "kokoro":
                if args.voice is None:
                    raise ValueError(f"{args.pte} is a Kokoro program: give its voice with --voice (voices/*.pt)")
                style = kokoro.voice_style(args.voice, len(args.ids))
                waveform = kokoro.synthesize(program, args.ids, style, speed=args.speed, seed=args.seed)
            else:
                if args.voice is not None or args.speed != 1.0:
                    raise ValueError(f"{args.pte} is a VITS program, which has one voice and speed: leave out --voice and --speed")
                waveform = vits.synthesize(program, args.ids, seed=args.seed)
    except (ValueError, RuntimeError, OSError) as error:
        print(f"generate-speech: {error}", file=sys.stderr)
        return 2
    rate = program.constant("get_sampling_rate")
    write_wav(waveform, rate, args.out)
    print(f"wrote {args.out}: {waveform.numel() / rate:.2f} s at {rate} Hz")
    return 0
