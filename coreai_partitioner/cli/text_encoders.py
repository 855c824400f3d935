"""What the two text encoder tasks of the export command share: ``fill-mask`` and ``feature-extraction``.

Both export one method, ``forward(input_ids [B, T], attention_mask [B, T])``,
of a BERT-class encoder (:mod:`coreai_partitioner.text_encoder`), and differ
only in its head: a ``...ForMaskedLM``'s logits, or the pooling of a
sentence-transformers checkpoint (:attr:`TextEncoderPlan.sentence`).  So
their flags (:data:`FLAGS`, :data:`DEFAULTS`), tiny configs (:func:`tiny_config`), plan
(:func:`settle_text`) and every step after it are the same
(:func:`dry_run`, :func:`reference`, :func:`lower`, :func:`describe`,
:func:`check`, :func:`write_tokenizer`), and each task module
(:mod:`.tasks.fill_mask`, :mod:`.tasks.feature_extraction`) takes them as
its own and supplies the rest: its name, model class, tiny models' names,
refusals, pooling and companions.
"""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.cli.command import CommandError
from coreai_partitioner.cli.task import Phases, Plan, at_dtype, copy_beside, host_form_only, partitioner_options
from coreai_partitioner.cli.task import forward_outputs as eager  # noqa: F401 - its eager outputs: the model's at --dtype


#: The shared flags both take: the input's bounds (no defaults of their own: a checkpoint's bound, a batch of 1).
FLAGS = ("--max-input-len", "--max-batch")
DEFAULTS: dict[str, Any] = {}


def tiny_config(name: str) -> Any:
    from coreai_partitioner.text_encoder.tiny import tiny_config

    return tiny_config(name)


def bare_encoder(model_type: str | None) -> str:
    """How a bare text encoder's checkpoint is exported (a sentence to end the refusal of its config with), or ``""``."""
    from coreai_partitioner.text_encoder import supported

    if model_type not in supported():
        return ""
    return (
        f". A bare {model_type} encoder exports as feature-extraction from a sentence-transformers checkpoint "
        "(modules.json beside config.json says its pooling) or as fill-mask from a *ForMaskedLM checkpoint"
    )


def add_flags(parser: argparse.ArgumentParser) -> None:
    """None of their own: the shared --max-input-len and --max-batch bound the input."""


@dataclass
class TextEncoderPlan(Plan):
    task: str = ""  # fill-mask or feature-extraction
    max_seq_len: int = 0  # the longest input forward takes
    sentence: Any = None  # text_encoder.SentenceConfig, feature-extraction's pooling; None: fill-mask's logits
    tokenizer_files: list[Path] = field(default_factory=list)  # the checkpoint's, copied beside the .pte
    runner_tokenizer: bool = False  # the caller tokenizes with transformers, not ExecuTorch's runner

    @property
    def output(self) -> str:
        """What ``forward`` returns, in words."""
        if self.sentence is None:
            return f"logits [B, T, {self.config.vocab_size}]"
        pooled = "+".join(self.sentence.modes) + (", unit length" if self.sentence.normalize else "")
        return f"embeddings [B, {self.config.hidden_size * len(self.sentence.modes)}] ({pooled})"

    @property
    def signature(self) -> str:
        return (f"forward(input_ids [B, T], attention_mask [B, T]) -> {self.output}; T 1 to {self.max_seq_len}, "
                f"B 1 to {self.args.max_batch}")


def settle_text(task: str, args: argparse.Namespace, config: Any, sentence: Any = None) -> TextEncoderPlan:
    """The host form, the model type (refused here if no family adapts it), the longest input, the tokenizer files."""
    from coreai_partitioner.text_encoder import LEAST_BOUND, TOKENIZER_FILES, family_of, max_seq_len_of, tokenizer_files

    host_form_only(task, args)
    longest = family_of(config).max_tokens(config)
    max_seq_len = args.max_input_len or max_seq_len_of(config, sentence)
    if not LEAST_BOUND <= max_seq_len <= longest:
        raise CommandError(
            f"--max-input-len {max_seq_len}: {config.model_type}'s position table numbers {longest} tokens; give "
            f"{LEAST_BOUND} to {longest}"
        )
    if not (args.max_batch == 1 or args.max_batch >= LEAST_BOUND):
        raise CommandError(
            f"--max-batch {args.max_batch}: give 1 or at least {LEAST_BOUND} (torch.export takes a dynamic batch to be "
            "at least 2, so a bound of 2 leaves it one size)"
        )
    files = tokenizer_files(args.checkpoint) if args.checkpoint else []
    if args.checkpoint and not files:
        warnings.warn(
            f"{args.checkpoint} has none of {', '.join(TOKENIZER_FILES)}: the .pte is exported without a tokenizer, "
            "and its caller must tokenize text itself",
            stacklevel=2,
        )
    return TextEncoderPlan(args, config, task=task, max_seq_len=max_seq_len, sentence=sentence, tokenizer_files=files)


def dry_run(plan: TextEncoderPlan) -> None:
    """What would be exported, from the config alone."""
    config, args = plan.config, plan.args
    tokenizer = ", ".join(p.name for p in plan.tokenizer_files) or "none"
    print(f"{config.model_type} {plan.task}: {config.num_hidden_layers} layer(s), {args.dtype}, host form")
    print(f"  {plan.signature}")
    print(f"  tokenizer: {tokenizer if args.checkpoint else 'one character per token (tiny config)'}")
    print(f"  would write {args.out}")


def eager_forward(plan: TextEncoderPlan, model: torch.nn.Module) -> Any:
    """Hugging Face's eager ``model`` computing the task, as the ``.pte``'s ``forward`` is called."""
    from coreai_partitioner.text_encoder.check import task_forward

    return task_forward(model, plan.task, plan.sentence)


def reference(plan: TextEncoderPlan, model: torch.nn.Module) -> Any:
    """The fp32 model on a seeded random text, its last quarter padding."""
    from coreai_partitioner.text_encoder.check import sample
    from coreai_partitioner.verify import forward

    return forward.reference(model, eager_forward(plan, model), sample(model.config, plan.max_seq_len))


def lower(plan: TextEncoderPlan, model: torch.nn.Module, phases: Phases) -> tuple[Any, Any]:
    """``forward`` lowered; under ``--verify`` the model computing the task at ``--dtype`` (``None`` at fp32)."""
    from coreai_partitioner.text_encoder import lower_text_encoder

    with phases("export and lower"):
        lowered = lower_text_encoder(
            model, plan.task, sentence=plan.sentence, max_seq_len=plan.max_seq_len, max_batch=plan.args.max_batch,
            **partitioner_options(plan.args),
        )
    return lowered, at_dtype(plan, eager_forward(plan, model))


def describe(plan: TextEncoderPlan, model: torch.nn.Module, pte: Any) -> None:
    config = model.config
    print(f"{type(model).__name__} ({config.model_type}): {config.num_hidden_layers} layer(s), {plan.args.dtype}")
    print(f"  methods: {', '.join(pte.methods)}")
    print(f"  {plan.signature}: {len(pte.coreai_delegates('forward'))} Core AI delegate(s)")


def check(plan: TextEncoderPlan, path: Path, verified: Any, eager: Any) -> Any:
    from coreai_partitioner.verify import forward

    return forward.check(path, verified, eager=eager, dtype=plan.dtype, logits=plan.sentence is None)


def write_tokenizer(plan: TextEncoderPlan, directory: Path) -> list[Path]:
    """The checkpoint's tokenizer files, or a tiny model's one-character-per-token tokenizer."""
    from coreai_partitioner.text_encoder import write_tokenizer
    from coreai_partitioner.text_encoder.tiny import tiny_tokenizer

    if plan.args.checkpoint:
        return [copy_beside(path, directory) for path in plan.tokenizer_files]
    return write_tokenizer(tiny_tokenizer(plan.args.config), directory)


def after(plan: Plan) -> None:
    """Nothing runs the .pte after the export: its caller is an app (optimum-executorch's, or ExecuTorch's runtime)."""
