"""Export a Hugging Face image classifier (ViT, DeiT; any other ``*ForImageClassification`` whole) to a .pte of its logits.

    python -m coreai_partitioner export --checkpoint path/to/vit-base-patch16-224 --verify --out out/model.pte
    python -m coreai_partitioner export --checkpoint path/to/deit-small-patch16-224 --dtype fp16 --verify
    python -m coreai_partitioner export --config vit --verify --out out/model.pte      # a tiny random ViT (or deit)

(the task is a ``*ForImageClassification`` checkpoint's.)  The .pte has one
method, ``forward(pixel_values [1, C, H, W]) -> logits [1, labels]``, one
image of the checkpoint's size, as optimum-executorch's
``ExecuTorchModelForImageClassification`` calls it, plus
``get_image_size`` and ``get_num_channels``.  ViT and DeiT are re-composed
over the model's own modules, attention and the LayerNorms Core AI
composites, in one delegate; any other classifier (ConvNeXt, ResNet...) is
lowered whole, what the converter takes of it delegated
(:mod:`coreai_partitioner.image_classification`).  Beside it:
``preprocessor_config.json``, the resizing and normalization an app applies
first (the runtime does neither).  ``--verify`` judges the logits of a
seeded random image against the eager model at ``--dtype`` within the
runtime's own rounding, the fp32 model's distance beside them.  Host form
only.  Nothing is downloaded.  Needs the hf extra.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner.cli.detect import Detection, Head
from coreai_partitioner.cli.task import Phases, Plan, at_dtype, copy_beside, host_form_only, partitioner_options
from coreai_partitioner.cli.task import forward_outputs as eager  # noqa: F401 - its eager outputs: the model's at --dtype

NAME = "image-classification"
DETECT = Detection(
    takes="a *ForImageClassification", heads=(Head("ForImageClassification"), Head("ForImageClassificationWithTeacher"))
)
MODEL = "AutoModelForImageClassification"
RUNNER = "optimum-executorch's ExecuTorchModelForImageClassification"
FLAGS: tuple[str, ...] = ()
DEFAULTS: dict[str, Any] = {}


def tiny_configs() -> list[str]:
    from coreai_partitioner.image_classification.tiny import NAMES

    return list(NAMES)


def tiny_config(name: str) -> Any:
    from coreai_partitioner.image_classification.tiny import tiny_config

    return tiny_config(name)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """None of its own: the input is one image of the checkpoint's size."""


def refusals() -> tuple[type[Exception], ...]:
    """None: a classifier ViT and DeiT do not adapt is lowered whole, not refused."""
    return ()


def settle(args: argparse.Namespace, config: Any) -> Plan:
    """An image classifier's checkpoint, the host form."""
    host_form_only(NAME, args)
    return Plan(args, config, runner_tokenizer=False)


def form(adapted: bool) -> str:
    """How the classifier is lowered, in words."""
    return "re-composed, attention and LayerNorms as Core AI composites" if adapted else "lowered whole"


def signature(config: Any) -> str:
    from coreai_partitioner.image_classification import input_shape

    return f"forward(pixel_values [1, {', '.join(map(str, input_shape(config)))}]) -> logits [1, {config.num_labels}]"


def processor_file(plan: Plan) -> Path | None:
    """The checkpoint's ``preprocessor_config.json``, or ``None`` (a tiny model's processor is made)."""
    from coreai_partitioner.image_classification import PROCESSOR_FILE

    path = plan.args.checkpoint / PROCESSOR_FILE if plan.args.checkpoint else None
    return path if path is not None and path.is_file() else None


def dry_run(plan: Plan) -> None:
    """What would be exported, from the config alone."""
    from coreai_partitioner.image_classification import CLASSIFIERS

    config, args = plan.config, plan.args
    architecture = (config.architectures or [f"{config.model_type} classifier"])[0]
    adapted = architecture in CLASSIFIERS.get(config.model_type, {})
    print(f"{architecture} ({config.model_type}): {form(adapted)}, {args.dtype}, host form")
    print(f"  {signature(config)}")
    found = processor_file(plan)
    print(f"  preprocessor: {found.name if found else 'none' if args.checkpoint else 'made for the tiny model'}")
    print(f"  would write {args.out}")


# ---------------------------------------------------------------- export


def forward_of(model: torch.nn.Module) -> Any:
    from coreai_partitioner.image_classification import Logits

    return Logits(model)


def reference(plan: Plan, model: torch.nn.Module) -> Any:
    """The fp32 model on a seeded random image of its size."""
    from coreai_partitioner.image_classification import input_shape
    from coreai_partitioner.verify import forward

    pixels = torch.randn(1, *input_shape(model.config), generator=torch.Generator().manual_seed(1))
    return forward.reference(model, forward_of(model), (pixels,))


def lower(plan: Plan, model: torch.nn.Module, phases: Phases) -> tuple[Any, Any]:
    """``forward`` lowered; under ``--verify`` the model's logits at ``--dtype`` (``None`` at fp32)."""
    from coreai_partitioner.image_classification import lower_image_classifier

    with phases("export and lower"):
        lowered = lower_image_classifier(model, **partitioner_options(plan.args))
    return lowered, at_dtype(plan, forward_of(model))


def describe(plan: Plan, model: torch.nn.Module, pte: Any) -> None:
    from coreai_partitioner.image_classification import adapted

    print(f"{type(model).__name__} ({model.config.model_type}): {form(adapted(model))}, {plan.args.dtype}")
    print(f"  methods: {', '.join(pte.methods)}")
    print(f"  {signature(model.config)}: {len(pte.coreai_delegates('forward'))} Core AI delegate(s)")


def check(plan: Plan, path: Path, verified: Any, eager: Any) -> Any:
    from coreai_partitioner.verify import forward

    return forward.check(path, verified, eager=eager, dtype=plan.dtype, logits=True)


def companions(plan: Plan, directory: Path) -> list[Path]:
    """``preprocessor_config.json``: the checkpoint's, or the tiny model's processor's."""
    from coreai_partitioner.image_classification import write_image_processor
    from coreai_partitioner.image_classification.tiny import tiny_processor

    if not plan.args.checkpoint:
        return [write_image_processor(tiny_processor(plan.config), directory)]
    found = processor_file(plan)
    if found is not None:
        return [copy_beside(found, directory)]
    warnings.warn(
        f"{plan.args.checkpoint} has no preprocessor_config.json: a caller must resize and normalize images itself "
        "(the .pte's get_image_size says to what size)",
        stacklevel=2,
    )
    return []


def after(plan: Plan) -> None:
    """Nothing runs the .pte after the export: its caller is an app (optimum-executorch's, or ExecuTorch's runtime)."""
