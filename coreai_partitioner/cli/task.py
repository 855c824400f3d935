"""What a task module of the export command is (:class:`Task`), its plan (:class:`Plan`), and the steps several tasks take.

A task is a module of :mod:`coreai_partitioner.cli.tasks`: it says how its
checkpoints are recognised (``DETECT``, :mod:`.detect`), which shared flags
it takes (``FLAGS``, :mod:`.flags`), and supplies only what is its own
(:class:`Task`, every hook the command calls); the command (:mod:`.export`)
does the rest.  A hook a task may leave out has a default
(:func:`with_defaults`, which the registry applies to each task module).
The functions below are steps more than one task calls from its own.
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Protocol

import torch

from coreai_partitioner.cli.checkpoint import transformers_config
from coreai_partitioner.cli.command import CommandError
from coreai_partitioner.cli.flags import DTYPES


class Task(Protocol):
    """What a task module (:mod:`.tasks`) supplies: only what is its own.

    A module satisfies it with module-level names: ``NAME`` (optimum's task
    name), ``DETECT`` (how its checkpoints are recognised: a
    :class:`.detect.Detection`), ``MODEL`` (the ``transformers`` auto class it loads),
    ``RUNNER`` (what runs its ``.pte``, for messages), ``FLAGS`` (the
    shared flags it takes beyond :data:`.flags.COMMON`), ``DEFAULTS`` (their
    defaults for it) and these functions.  Those marked *optional* have a default
    (:func:`with_defaults`): ``STREAMS_WEIGHTS``, :meth:`load_config`,
    :meth:`load_model`, :meth:`tiny_model` and :meth:`add_generate_command`.
    """

    NAME: str
    DETECT: Any  # a detect.Detection (detect imports this module)
    MODEL: str
    RUNNER: str
    FLAGS: tuple[str, ...]
    DEFAULTS: dict[str, Any]
    #: Optional (default ``False``): under ``--quantize``, the weights it stores may be read from a safetensors
    #: checkpoint one at a time as they are compressed (:func:`streams_weights`).
    STREAMS_WEIGHTS: bool

    def tiny_configs(self) -> list[str]:
        """The ``--config`` names: its tiny random models."""

    def tiny_config(self, name: str) -> Any:
        """The config of the tiny random model ``name``."""

    def tiny_model(self, config: Any) -> torch.nn.Module:
        """Optional: the tiny random model of ``config`` in fp32, after ``torch.manual_seed(0)`` (default:
        ``MODEL.from_config``, :func:`auto_tiny_model`)."""

    def load_config(self, checkpoint: Path) -> Any:
        """Optional: ``--checkpoint``'s config (default: transformers', :func:`transformers_config`; a checkpoint that
        is not one transformers model, a diffusers pipeline, has its own)."""

    def load_model(self, plan: Plan, dtype: torch.dtype, *, reference: bool = False) -> torch.nn.Module:
        """Optional: the model to export at ``dtype``, or (``reference``) ``--verify``'s fp32 reference (default:
        ``MODEL``'s, :func:`auto_model`; a task whose model is not one auto class's, a pipeline's parts, has its
        own)."""

    def add_generate_command(self, commands: Any) -> None:
        """Optional: add the command that runs its ``.pte`` (``generate-speech``) to ``python -m coreai_partitioner``'s
        subcommands, setting its ``run`` (default: none)."""

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
    layer_by_layer: bool = False  # --verify's references run a module at a time (:func:`layer_by_layer`); set at export

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

    @property
    def streamable(self) -> bool:
        """Whether the model exported is the checkpoint's own modules, so its weights may stay in the checkpoint until
        read (a plan that wraps them, a PEFT adapter's, says not)."""
        return True


# ---------------------------------------------------------------- the hooks' defaults

#: What a task module must define: the :class:`Task` protocol's names but the optional ones.
OPTIONAL = ("STREAMS_WEIGHTS", "tiny_model", "load_config", "load_model", "add_generate_command")
REQUIRED = tuple(name for name in (*Task.__annotations__, *vars(Task)) if not name.startswith("_") and name not in OPTIONAL)


def with_defaults(task: ModuleType) -> ModuleType:
    """``task`` (a module of :mod:`.tasks`) with each optional hook it leaves out set to its default; a task that lacks
    a hook it must define is refused, naming it."""
    missing = [name for name in REQUIRED if name not in vars(task)]
    if missing:
        raise TypeError(f"task module {task.__name__} defines no {', '.join(missing)}: every task defines the Task protocol's hooks (cli/task.py)")
    defaults = {
        "STREAMS_WEIGHTS": False,
        "tiny_model": functools.partial(auto_tiny_model, task),
        "load_config": transformers_config,
        "load_model": functools.partial(auto_model, task),
        "add_generate_command": no_generate_command,
    }
    for name, default in defaults.items():
        vars(task).setdefault(name, default)
    return task


def no_generate_command(commands: Any) -> None:
    """The default ``add_generate_command``: a task whose ``.pte`` a runner of ExecuTorch's runs adds none."""


def auto_tiny_model(task: Task, config: Any) -> torch.nn.Module:
    """The default ``tiny_model``: ``MODEL.from_config`` in fp32 (the seed set by the caller)."""
    import transformers

    return getattr(transformers, task.MODEL).from_config(config, dtype=torch.float32, attn_implementation="eager").eval()


def auto_model(task: Task, plan: Plan, dtype: torch.dtype, *, reference: bool = False) -> torch.nn.Module:
    """The default ``load_model``: the checkpoint at ``dtype`` as ``MODEL`` loads it, its weights left in it where
    :func:`streams_weights` (those ``--quantize`` stores) or :func:`layer_by_layer` (``--verify``'s reference: every
    one); or the tiny config's seeded model, made in fp32 and loaded into one made at ``dtype`` (what a checkpoint of
    it loads as), so its fp32 twin (``--verify``'s reference) has the same weights."""
    import transformers

    auto = getattr(transformers, task.MODEL)
    if plan.args.checkpoint:
        if reference and plan.layer_by_layer:
            from coreai_partitioner.quantize.streamed import load_streamed

            model = load_streamed(auto, plan.args.checkpoint, plan.config, dtype)  # --verify's reference: every weight
        elif streams_weights(task, plan):
            from coreai_partitioner.quantize.streamed import load_streamed

            model = load_streamed(auto, plan.args.checkpoint, plan.config, dtype, plan.args.quantize)
        else:
            model = auto.from_pretrained(
                plan.args.checkpoint, config=plan.config, dtype=dtype, local_files_only=True, attn_implementation="eager"
            ).eval()
    else:
        torch.manual_seed(0)
        model = task.tiny_model(plan.config)
        if dtype != torch.float32:
            cast = auto.from_config(plan.config, dtype=dtype, attn_implementation="eager").eval()
            cast.load_state_dict(model.state_dict())
            model = cast
    if plan.generation is not None:
        model.generation_config = plan.generation
    return model


# ---------------------------------------------------------------- weights left in the checkpoint


def can_stream(task: Task, plan: Plan) -> bool:
    """A task that says it can (``STREAMS_WEIGHTS``) under ``--quantize``, a safetensors checkpoint, and a plan that
    exports the checkpoint's own modules (:attr:`Plan.streamable`)."""
    args = plan.args
    if not (task.STREAMS_WEIGHTS and args.quantize and args.checkpoint and plan.streamable):
        return False
    from coreai_partitioner.checkpoints import checkpoint_files

    return bool(checkpoint_files(args.checkpoint))


def streams_weights(task: Task, plan: Plan) -> bool:
    """Whether the weights ``--quantize`` stores are read from the checkpoint one at a time as they are compressed
    (:mod:`coreai_partitioner.quantize.streamed`): where it :func:`can_stream`, and under ``--verify`` only where its
    fp32 reference runs a module at a time (:func:`layer_by_layer`): otherwise the model it loads whole is exported."""
    return can_stream(task, plan) and (not plan.args.verify or plan.layer_by_layer)


def layer_by_layer(task: Task, plan: Plan) -> bool:
    """Whether ``--verify --quantize``'s fp32 reference runs a module at a time, each weight read from the
    checkpoint while its module runs (:func:`~coreai_partitioner.checkpoints.read_while_running`): where the
    export :func:`can_stream` and the checkpoint is too large to hold whole
    (:func:`~coreai_partitioner.checkpoints.too_large_to_hold`).  The export then streams too, and the quantized
    eager model runs its weights compressed, each expanded when its op runs."""
    if not (plan.args.verify and can_stream(task, plan)):
        return False
    from coreai_partitioner.checkpoints import too_large_to_hold

    return too_large_to_hold(plan.args.checkpoint)


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


def describe_encoder_decoder(pte: Any, encoder_inputs: str, vocab_size: int, slots: int) -> None:
    """The methods of an encoder-decoder ``.pte`` (speech recognition, text-to-text generation) and their delegates."""
    print(f"  methods: {', '.join(pte.methods)}")
    print(f"  encoder({encoder_inputs}) -> cross-attention keys and values: "
          f"{len(pte.coreai_delegates('encoder'))} Core AI delegate")
    print(f"  text_decoder(ids [1, 1], cross, cache_position [1]) -> logits [1, 1, {vocab_size}]: "
          f"{len(pte.coreai_delegates('text_decoder'))} Core AI delegate; {slots} cache slots")


def copy_beside(source: Path, directory: Path) -> Path:
    """``source`` copied into ``directory`` (nothing to do when it is there already); the copy's path."""
    target = directory / source.name
    if source.resolve() != target.resolve():
        target.write_bytes(source.read_bytes())
    return target
