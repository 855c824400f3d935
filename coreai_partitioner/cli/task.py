"""What a task module of the export command is (:class:`Task`), its plan (:class:`Plan`), and the steps several tasks take.

A task is a module of :mod:`coreai_partitioner.cli.tasks`: it says how its
checkpoints are recognised (``DETECT``, :mod:`.detect`), which shared flags
it takes (``FLAGS``, :mod:`.flags`), and supplies only what is its own
(:class:`Task`); the command (:mod:`.export`) does the rest.  The functions
below are steps more than one task calls from its own.
"""

from __future__ import annotations

import argparse
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import torch

from coreai_partitioner.cli.command import CommandError
from coreai_partitioner.cli.flags import DTYPES

if TYPE_CHECKING:
    from coreai_partitioner.cli.detect import Detection


class Task(Protocol):
    """What a task module (:mod:`.tasks`) supplies: only what is its own.

    A module satisfies it with module-level names: ``NAME`` (optimum's task
    name), ``DETECT`` (how its checkpoints are recognised: a
    :class:`.detect.Detection`), ``MODEL`` (the ``transformers`` auto class it loads),
    ``RUNNER`` (what runs its ``.pte``, for messages), ``FLAGS`` (the
    shared flags it takes beyond :data:`.flags.COMMON`), ``DEFAULTS`` (their
    defaults for it) and these functions.
    """

    NAME: str
    DETECT: Detection
    MODEL: str
    RUNNER: str
    FLAGS: tuple[str, ...]
    DEFAULTS: dict[str, Any]

    def tiny_configs(self) -> list[str]:
        """The ``--config`` names: its tiny random models."""

    def tiny_config(self, name: str) -> Any:
        """The config of the tiny random model ``name``.  (A task whose tiny model is not ``MODEL.from_config`` of
        it, seeded, also gives ``tiny_model(config)``: the model in fp32.)"""

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        """Its own flags."""

    def refusals(self) -> tuple[type[Exception], ...]:
        """The errors that refuse its input: printed as one line, no traceback."""

    def settle(self, args: argparse.Namespace, config: Any) -> Plan:
        """Its own checks that need no weights (a checkpoint of another task is refused before it); its :class:`Plan`."""

    def dry_run(self, plan: Plan) -> None:
        """Print what would be exported, from the config alone."""

    def reference(self, plan: Plan, model: torch.nn.Module) -> Any:
        """``--verify``'s reference: the fp32 model's outputs."""

    def lower(self, plan: Plan, model: torch.nn.Module, phases: Phases) -> tuple[Any, Any]:
        """The lowered program (an ``EdgeProgramManager``, or programs with a ``save``) and, under ``--verify``, the
        eager model it was lowered from where that is not the fp32 reference's (the model at ``--dtype``, the
        quantized eager methods), else ``None``."""

    def eager(self, plan: Plan, lowered: Any, lowered_from: Any, verified: Any) -> Any:
        """``--verify``'s outputs of ``lowered_from`` (:meth:`lower`'s second) where the ``.pte``'s are read: what
        :meth:`check` judges the ``.pte`` against."""

    def describe(self, plan: Plan, model: torch.nn.Module, pte: Any) -> None:
        """Print what the written ``.pte`` holds (``pte`` is :func:`~coreai_partitioner.backends.apple_coreai.runtime.pte.read_pte`'s)."""

    def check(self, plan: Plan, path: Path, verified: Any, eager: Any) -> Any:
        """The ``.pte`` at ``path`` judged: a report with ``ok`` and ``against``."""

    def companions(self, plan: Plan, directory: Path) -> list[Path]:
        """Write what a caller needs beside the ``.pte`` (a tokenizer, a preprocessor's config); the paths written."""

    def after(self, plan: Plan) -> None:
        """Run the written ``.pte`` as its flags ask (``--generate``, ``--chat``, ``--transcribe``)."""


@dataclass
class Plan:
    """What the command will do, settled from its input before any weights are loaded; a task's plan adds its own."""

    args: argparse.Namespace
    config: Any
    tokenizer: Any = None  # decoder.tokenizer.Tokenizer, or None (a tiny model's is made); settled after the task's checks
    runner_tokenizer: bool = True  # ExecuTorch's runner reads the tokenizer (checked first); False: the .pte's caller tokenizes
    layer_by_layer: bool = False  # --verify's references run a module at a time (export.layer_by_layer); set at export

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.args.dtype]

    @property
    def load_dtype(self) -> torch.dtype:
        """What the weights are loaded in: the export's dtype (a task may load wider and cast parts down)."""
        return self.dtype

    @property
    def generation(self) -> Any:
        """A ``GenerationConfig`` the loaded model carries instead of its own, or ``None``."""
        return None


class Phases:
    """The seconds of each phase of an export, and the progress bar that names the phase running (on a terminal)."""

    def __init__(self) -> None:
        from tqdm import tqdm

        self.seconds: dict[str, float] = {}
        self.bar = tqdm(unit="phase", leave=False, disable=None)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.bar.set_description(name)
        start = time.perf_counter()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
        self.bar.update()

    def __str__(self) -> str:
        return "  seconds: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in self.seconds.items())


def partitioner_options(args: argparse.Namespace) -> dict[str, Any]:
    """What every task's lowering hands its partitioners from the command line: ``--debug-info``, ``--external-data``."""
    return {"debug_info": args.debug_info, "external_data": args.external_data}


def checkpoint_generation(checkpoint: Path, config: Any) -> Any:
    """The checkpoint's ``GenerationConfig``, or its model config's where it has no ``generation_config.json``."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(checkpoint, local_files_only=True)
    except OSError:
        return GenerationConfig.from_model_config(config)


def host_form_only(name: str, args: argparse.Namespace) -> None:
    """Refuse ``--target device`` for a task this package exports in the host form only."""
    if args.target != "host":
        raise CommandError(
            f"--target {args.target}: {name} exports the host form only, for this package's runtime (there is no "
            "device form of it); leave out --target"
        )


def first_layers(config: Any, args: argparse.Namespace) -> Any:
    """``config`` cut to its text decoder's first ``--num-layers`` layers (as it is without the flag)."""
    from coreai_partitioner.text_decoder import first_layers as cut

    if args.num_layers is None:
        return config
    try:
        return cut(config, args.num_layers)
    except ValueError as error:
        raise CommandError(str(error)) from None

def tokenizer_beside(plan: Plan) -> Path:
    """The tokenizer file written beside the ``.pte`` (the checkpoint's under its own name, a tiny model's
    ``tokenizer.json``): what ``--generate`` hands the runner."""
    return plan.args.out.parent / (plan.tokenizer.path.name if plan.tokenizer else "tokenizer.json")


def describe_tokenizer(plan: Plan) -> str:
    """The dry run's tokenizer line."""
    if plan.tokenizer is not None:
        return plan.tokenizer.describe()
    return "one character per token (tiny config)" if not plan.args.checkpoint else "none"


def at_dtype(plan: Plan, forward: Any) -> Any:
    """``forward`` (the model at ``--dtype``, or a step of it) where ``--verify`` judges the ``.pte`` against it: a
    task's ``lower``'s second; ``None`` at fp32 (the reference is its own)."""
    return forward if plan.args.verify and plan.dtype != torch.float32 else None


def forward_outputs(plan: Plan, lowered: Any, forward: Any, verified: Any) -> Any:
    """A task's ``eager`` for a ``.pte`` called once: ``forward`` on the reference's inputs
    (:mod:`coreai_partitioner.verify.forward`)."""
    from coreai_partitioner.verify.forward import outputs

    return outputs(forward, verified.inputs, plan.dtype)

def tokenizer_and_preprocessor(plan: Plan, directory: Path, tiny: Any, without: str) -> list[Path]:
    """A multimodal task's companions: the tokenizer and the checkpoint's ``preprocessor_config.json`` (what an app
    prepares the runner's inputs with), or a tiny model's ``tiny() -> (tokenizer, preprocessor)``; ``without`` ends
    the warning when the checkpoint has no preprocessor config.  The paths written."""
    from coreai_partitioner.text_decoder import tokenizer

    args = plan.args
    if not args.checkpoint:
        tiny_tokenizer, preprocessor = tiny()
        tiny_tokenizer.backend_tokenizer.save(str(directory / "tokenizer.json"))
        preprocessor.to_json_file(str(directory / "preprocessor_config.json"))
        return [directory / "tokenizer.json", directory / "preprocessor_config.json"]
    written = tokenizer.copy(plan.tokenizer, directory) if plan.tokenizer is not None else []
    source = args.checkpoint / "preprocessor_config.json"
    if source.is_file():
        return [*written, copy_beside(source, directory)]
    warnings.warn(f"{args.checkpoint} has no preprocessor_config.json: {without}", stacklevel=3)
    return written


def copy_beside(source: Path, directory: Path) -> Path:
    """``source`` copied into ``directory`` (nothing to do when it is there already); the copy's path."""
    target = directory / source.name
    if source.resolve() != target.resolve():
        target.write_bytes(source.read_bytes())
    return target
