"""Export a Hugging Face VITS (MMS-TTS) checkpoint to a .pte that speaks: ``durations`` and ``decoder``.

    python -m coreai_partitioner export --checkpoint path/to/mms-tts-eng --verify --out out/model.pte
    python -m coreai_partitioner export --config vits --verify --out out/model.pte      # a tiny random VITS
    python -m coreai_partitioner generate-speech out/model.pte --ids 0,19,0,45,0 --seed 0 --out speech.wav

(the task is a ``VitsModel`` checkpoint's.)  The .pte has two methods, split
where the length becomes data-dependent (:mod:`coreai_partitioner.text_to_speech.vits`):
``durations(input_ids [1, T], attention_mask [1, T], duration_noise [1, 2, T])``
with ``T`` fixed at ``--max-tokens`` (the ids padded, the mask saying which
are), and ``decoder(durations, prior_means, prior_log_variances, noise [1, C, F])
-> waveform [1, F * hop]`` with ``F`` up to ``--max-frames``; one Core AI
delegate each, plus ``get_sampling_rate`` and the loop's limits.
``generate-speech`` is the loop: it draws the noises as ``VitsModel`` draws
them from ``--seed`` and writes a WAV at the model's sampling rate.  The app
turns text into ids (``VitsTokenizer``'s ``vocab.json``, copied beside the
``.pte``).  ``--verify`` judges the waveform and durations of seeded random ids
against ``VitsModel`` itself at the same seed.  fp32, single speaker;
``--target device`` is the form upstream's on-device runtime runs (the ids and
mask cross as fp32).
Nothing is downloaded.  Needs the hf extra.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.cli.command import CommandError
from coreai_partitioner.cli.detect import Detection, Head
from coreai_partitioner.cli.task import Phases, Plan, copy_beside, partitioner_options

NAME = "text-to-speech"
DETECT = Detection(takes="a VitsModel (MMS-TTS)", heads=(Head("VitsModel"),), model_types=("vits",))
MODEL = "VitsModel"
RUNNER = "this package's generate-speech loop (python -m coreai_partitioner generate-speech)"
FLAGS: tuple[str, ...] = ()
DEFAULTS: dict[str, Any] = {}
#: The tokenizer files of a VITS checkpoint, copied beside the .pte for the app that makes the ids.
TOKENIZER_FILES = ("vocab.json", "tokenizer_config.json", "special_tokens_map.json")
#: How close the .pte's waveform is to VitsModel's at the same seed, in fp32 (the issue's bound).
LEAST_SNR_DB = 40.0


def tiny_configs() -> list[str]:
    from coreai_partitioner.text_to_speech.tiny import NAMES

    return list(NAMES)


def tiny_config(name: str) -> Any:
    from coreai_partitioner.text_to_speech.tiny import tiny_config

    return tiny_config(name)


def tiny_model(config: Any) -> Any:
    from coreai_partitioner.text_to_speech.tiny import tiny_model

    return tiny_model(config)


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=256, help="the most token ids one call takes (default 256)")
    parser.add_argument("--max-frames", type=int, default=4096,
                        help="the most spectrogram frames the decoder makes (default 4096: with MMS-TTS's hop of 256 "
                             "at 16 kHz, 65 s of speech)")


def refusals() -> tuple[type[Exception], ...]:
    from coreai_partitioner.text_to_speech import UnsupportedVits

    return (UnsupportedVits,)


def settle(args: argparse.Namespace, config: Any) -> Plan:
    """A single-speaker VITS, fp32, limits the decoder can take."""
    from coreai_partitioner.text_to_speech.vits import check_config

    if args.dtype != "fp32":
        raise CommandError(
            f"--dtype {args.dtype}: text-to-speech exports fp32 (a duration is the ceiling of the predictor's output, "
            "which fp16's rounding can move by a frame, and the waveform's length with it); leave out --dtype"
        )
    check_config(config)
    if args.max_tokens < 1 or args.max_frames < 5:
        raise CommandError(f"--max-tokens {args.max_tokens} --max-frames {args.max_frames}: give at least 1 and 5")
    return Plan(args, config, runner_tokenizer=False)


def dry_run(plan: Plan) -> None:
    from coreai_partitioner.text_to_speech.vits import hop_length

    config, args = plan.config, plan.args
    hop = hop_length(config)
    print(f"VitsModel (vits): {config.num_hidden_layers} text-encoder layer(s), fp32, {args.target} form, {config.sampling_rate} Hz")
    print(f"  durations(input_ids [1, {args.max_tokens}], attention_mask, duration_noise [1, 2, {args.max_tokens}])")
    print(f"  decoder(durations, prior_means, prior_log_variances, noise [1, {config.flow_size}, F <= {args.max_frames}]) "
          f"-> waveform [1, F * {hop}]")
    print(f"  would write {args.out}")


# ---------------------------------------------------------------- export


@dataclass(frozen=True)
class SpeechReference:
    """VitsModel's own forward on seeded random ids at a seed: its waveform and per-token durations."""

    ids: list[int]
    seed: int
    waveform: torch.Tensor
    durations: torch.Tensor


def reference(plan: Plan, model: torch.nn.Module) -> SpeechReference:
    from coreai_partitioner.text_to_speech.vits import reference

    count = min(plan.args.max_tokens, 16)
    ids = torch.randint(0, model.config.vocab_size, (count,), generator=torch.Generator().manual_seed(1)).tolist()
    return SpeechReference(ids, 0, *reference(model, ids, seed=0))


def lower(plan: Plan, model: torch.nn.Module, verified: Any, phases: Phases) -> tuple[Any, Any]:
    from coreai_partitioner.text_to_speech import lower_vits

    with phases("export and lower"):
        lowered = lower_vits(
            model, max_tokens=plan.args.max_tokens, max_frames=plan.args.max_frames,
            device=plan.args.target == "device", **partitioner_options(plan.args),
        )
    return lowered, None


def describe(plan: Plan, model: torch.nn.Module, pte: Any) -> None:
    print(f"VitsModel (vits): fp32, {plan.args.target} form, {model.config.sampling_rate} Hz")
    print(f"  methods: {', '.join(pte.methods)}")
    for method in ("durations", "decoder"):
        print(f"  {method}: {len(pte.coreai_delegates(method))} Core AI delegate(s)")


@dataclass(frozen=True)
class SpeechReport:
    """The .pte's durations and waveform against VitsModel's at the same ids and seed."""

    durations_equal: bool
    snr_db: float
    samples: tuple[int, int]  # the .pte's, VitsModel's
    against: str = "VitsModel's forward at the same seed"

    @property
    def ok(self) -> bool:
        return self.durations_equal and self.samples[0] == self.samples[1] and self.snr_db >= LEAST_SNR_DB

    def __str__(self) -> str:
        return (
            f"verify: seeded random ids through durations and decoder against {self.against}, the check:\n"
            f"  durations {'equal' if self.durations_equal else 'DIFFER'}; {self.samples[0]} samples "
            f"(VitsModel: {self.samples[1]}); SNR {self.snr_db:.1f} dB (at least {LEAST_SNR_DB:.0f})"
            f" {'ok' if self.ok else 'FAILED'}"
        )


def check(plan: Plan, path: Path, verified: SpeechReference, eager: Any) -> SpeechReport:
    from coreai_partitioner.text_to_speech import VitsProgram, synthesize
    from coreai_partitioner.text_to_speech.vits import durations_of
    from coreai_partitioner.verify.fidelity import snr_psnr

    program = VitsProgram(path)
    durations = durations_of(program, verified.ids, seed=verified.seed)
    waveform = synthesize(program, verified.ids, seed=verified.seed)
    expected = verified.waveform
    same = waveform.shape == expected.shape
    snr = snr_psnr(waveform, expected)[0] if same else float("-inf")
    return SpeechReport(torch.equal(durations, verified.durations), snr, (waveform.numel(), expected.numel()))


def companions(plan: Plan, directory: Path) -> list[Path]:
    """The checkpoint's tokenizer files (``vocab.json``...), for the app that turns text into ids."""
    if not plan.args.checkpoint:
        return []
    return [copy_beside(plan.args.checkpoint / name, directory) for name in TOKENIZER_FILES
            if (plan.args.checkpoint / name).is_file()]


def after(plan: Plan) -> None:
    """Nothing: ``generate-speech`` runs the .pte."""


# ---------------------------------------------------------------- generate-speech


def add_generate_command(commands: Any) -> None:
    """``generate-speech PTE --ids ... [--seed N] [--out speech.wav]``, a subcommand of ``python -m coreai_partitioner``."""
    parser = commands.add_parser("generate-speech", help="run a text-to-speech .pte (export's text-to-speech task) and write a WAV")
    parser.add_argument("pte", type=Path)
    parser.add_argument("--ids", required=True, type=ids_of, help="the token ids, comma-separated (12,5,33,...)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the noises' seed: the waveform transformers' set_seed(SEED); model(ids) gives")
    parser.add_argument("--out", type=Path, default=Path("speech.wav"))
    parser.set_defaults(run=generate_speech)


def ids_of(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give token ids as integers separated by commas (12,5,33)") from None


def generate_speech(args: argparse.Namespace) -> int:
    """The loop (:func:`coreai_partitioner.text_to_speech.synthesize`) and the WAV; 2 for ids or a .pte it refuses."""
    import sys

    from coreai_partitioner import console
    from coreai_partitioner.text_to_speech import VitsProgram, synthesize, write_wav

    try:
        with console.NativeStreams():  # the Core AI runtime's own lines as it loads each function
            program = VitsProgram(args.pte)
            waveform = synthesize(program, args.ids, seed=args.seed)
    except (ValueError, RuntimeError) as error:
        print(f"generate-speech: {error}", file=sys.stderr)
        return 2
    rate = program.constant("get_sampling_rate")
    write_wav(waveform, rate, args.out)
    print(f"wrote {args.out}: {waveform.numel() / rate:.2f} s at {rate} Hz")
    return 0
