"""Export a text-to-speech checkpoint to a .pte that speaks: ``durations`` and ``decoder``.

    python -m coreai_partitioner export --checkpoint path/to/mms-tts-eng --verify --out out/model.pte
    python -m coreai_partitioner export --checkpoint path/to/Kokoro-82M --verify --out out/kokoro.pte
    python -m coreai_partitioner export --config vits --verify --out out/model.pte      # a tiny random VITS
    python -m coreai_partitioner generate-speech out/model.pte --ids 0,19,0,45,0 --seed 0 --out speech.wav
    python -m coreai_partitioner generate-speech out/kokoro.pte --ids 50,83,54 --voice af_heart.pt --out speech.wav

Each family is a module of :mod:`coreai_partitioner.text_to_speech.families`,
which this task asks for all that is its own: transformers' ``VitsModel``
(MMS-TTS; a checkpoint whose config names it) and Kokoro-82M (the ``kokoro``
package's ``KModel``; a directory of its ``config.json``, with ``istftnet``
and ``plbert``, and its ``.pth``).  The .pte has two methods, split where the
length becomes data-dependent: ``durations`` with ``T`` fixed at
``--max-tokens`` (the ids padded, a mask saying which are), and ``decoder``
with the frames ``F`` up to ``--max-frames``; one Core AI delegate each,
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.cli.checkpoint import transformers_config
from coreai_partitioner.cli.command import CommandError
from coreai_partitioner.cli.detect import Detection, Head
from coreai_partitioner.cli.task import Phases, Plan, copy_beside, partitioner_options
from coreai_partitioner.text_to_speech import families


def _is_checkpoint(directory: Path) -> bool:
    return families.family_of_directory(directory) is not None


NAME = "text-to-speech"
DETECT = Detection(
    takes=" or ".join(family.TAKES for family in families.registry().values()),
    heads=tuple(Head(head) for family in families.registry().values() for head in family.HEADS),
    model_types=families.model_types, directory=_is_checkpoint,
)
MODEL = "VitsModel"
RUNNER = "this package's generate-speech loop (python -m coreai_partitioner generate-speech)"
FLAGS: tuple[str, ...] = ()
DEFAULTS: dict[str, Any] = {}
#: How close the .pte's waveform is to the model's at the same seed, in fp32 (the issue's bound).
LEAST_SNR_DB = 40.0


def tiny_configs() -> list[str]:
    return families.names()


def tiny_config(name: str) -> Any:
    from coreai_partitioner.text_to_speech.tiny import tiny_config

    return tiny_config(name)


def load_config(checkpoint: Path) -> Any:
    """The config of the family whose files the directory holds (Kokoro's), else the checkpoint's transformers
    config."""
    family = families.family_of_directory(checkpoint)
    if family is not None:
        return family.load_config(checkpoint)
    return transformers_config(checkpoint)


def load_model(plan: Plan, dtype: torch.dtype, *, reference: bool = False) -> torch.nn.Module:
    """The family's model, from the checkpoint or the tiny config, in fp32."""
    if not plan.args.checkpoint:
        from coreai_partitioner.text_to_speech.tiny import tiny_model

        return tiny_model(plan.config)
    return families.family_of(plan.config).load_model(plan.args.checkpoint, plan.config, dtype)


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="the most token ids one call takes (default: VITS 256; Kokoro 128 or its ALBERT's positions, with "
                             "its two boundary ids)")
    parser.add_argument("--max-frames", type=int, default=None,
                        help="the most frames the decoder makes (default: VITS 4096, 65 s of MMS-TTS at 16 kHz; "
                             "Kokoro 512, 12.8 s at 24 kHz)")


def refusals() -> tuple[type[Exception], ...]:
    return (families.UnknownFamily, *(family.Unsupported for family in families.registry().values()))


@dataclass
class SpeechPlan(Plan):
    family: Any = None  # the family module (text_to_speech.families)


def settle(args: argparse.Namespace, config: Any) -> SpeechPlan:
    """fp32; a config the family takes, and limits it can take."""
    if args.dtype != "fp32":
        raise CommandError(
            f"--dtype {args.dtype}: text-to-speech exports fp32 (a duration is a rounding of the predictor's output, "
            "which fp16's rounding can move by a frame, and the waveform's length with it); leave out --dtype"
        )
    family = families.family_of(config)
    args.max_tokens, args.max_frames = family.limits(config, args.max_tokens, args.max_frames)
    return SpeechPlan(args, config, runner_tokenizer=False, family=family)


def dry_run(plan: SpeechPlan) -> None:
    config, args, family = plan.config, plan.args, plan.family
    print(f"{family.TITLE}: {family.layers(config)}, fp32, {args.target} form, {config.sampling_rate} Hz")
    for line in family.methods(config, args.max_tokens, args.max_frames):
        print(f"  {line}")
    print(f"  would write {args.out}")


# ---------------------------------------------------------------- export


def reference(plan: SpeechPlan, model: torch.nn.Module) -> Any:
    """The family's seeded random ids through the model (:class:`~coreai_partitioner.text_to_speech.SpeechReference`)."""
    return plan.family.seeded_reference(model, plan.config, plan.args.max_tokens)


def lower(plan: SpeechPlan, model: torch.nn.Module, phases: Phases) -> tuple[Any, Any]:
    """The family's methods lowered; ``None``: the reference (the fp32 model's waveform) is the ``.pte``'s judge."""
    with phases("export and lower"):
        lowered = plan.family.lower(
            model, max_tokens=plan.args.max_tokens, max_frames=plan.args.max_frames,
            device=plan.args.target == "device", **partitioner_options(plan.args),
        )
    return lowered, None


def eager(plan: SpeechPlan, lowered: Any, lowered_from: Any, verified: Any) -> Any:
    """Nothing: the fp32 reference is the ``.pte``'s judge."""


def describe(plan: SpeechPlan, model: torch.nn.Module, pte: Any) -> None:
    print(f"{plan.family.TITLE}: fp32, {plan.args.target} form, {plan.config.sampling_rate} Hz")
    print(f"  methods: {', '.join(pte.methods)}")
    for method in ("durations", "decoder"):
        print(f"  {method}: {len(pte.coreai_delegates(method))} Core AI delegate(s)")


@dataclass(frozen=True)
class SpeechReport:
    """The .pte's durations and waveform against the model's at the same ids and seed."""

    durations_equal: bool
    snr_db: float
    samples: tuple[int, int]  # the .pte's, the model's
    against: str

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


def check(plan: SpeechPlan, path: Path, verified: Any, eager: Any) -> SpeechReport:
    from coreai_partitioner.text_to_speech import SpeechProgram
    from coreai_partitioner.verify.fidelity import snr_psnr

    durations, waveform = plan.family.replay(SpeechProgram(path), verified)
    expected = verified.waveform
    snr = snr_psnr(waveform, expected)[0] if waveform.shape == expected.shape else float("-inf")
    return SpeechReport(
        torch.equal(durations, verified.durations), snr, (waveform.numel(), expected.numel()), plan.family.AGAINST
    )


def companions(plan: SpeechPlan, directory: Path) -> list[Path]:
    """The checkpoint's files the app makes ids with (the family's ``ID_FILES``: VITS's ``vocab.json``...; Kokoro's
    ``config.json``, its vocab)."""
    if not plan.args.checkpoint:
        return []
    return [copy_beside(plan.args.checkpoint / name, directory) for name in plan.family.ID_FILES
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
    from coreai_partitioner.text_to_speech import SpeechProgram, family_named, write_wav

    try:
        with console.NativeStreams():  # the Core AI runtime's own lines as it loads each function
            program = SpeechProgram(args.pte)
            family = family_named(program.family)
            waveform = family.speak(program, args.ids, voice=args.voice, speed=args.speed, seed=args.seed)
    except (ValueError, RuntimeError, OSError) as error:
        print(f"generate-speech: {error}", file=sys.stderr)
        return 2
    rate = program.constant("get_sampling_rate")
    write_wav(waveform, rate, args.out)
    print(f"wrote {args.out}: {waveform.numel() / rate:.2f} s at {rate} Hz")
    return 0
