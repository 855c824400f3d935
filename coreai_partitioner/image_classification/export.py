"""One ``.pte`` whose ``forward(pixel_values)`` gives an image classifier's logits, its image processor beside it.

:func:`lower_image_classifier` adapts ViT and DeiT (:mod:`.vit`: the
encoder's SDPA and ``layer_norm`` composites) and lowers any other
``...ForImageClassification`` (ConvNeXt, MobileViT, ResNet...) whole as a
plain model (:func:`coreai_partitioner.lower`), what the converter takes of
it delegated.  The input is one image of the checkpoint's size, as
optimum-executorch exports it; the size rides along as constant methods.
:func:`write_image_processor` puts ``preprocessor_config.json`` beside the
``.pte`` (the resizing and normalization an app applies first).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from coreai_partitioner.image_classification.vit import CLASSIFIERS, adapt, image_size

logger = logging.getLogger(__name__)

#: The processor file a checkpoint keeps its preprocessing in.
PROCESSOR_FILE = "preprocessor_config.json"


def adapted(model: nn.Module) -> bool:
    """Whether :mod:`.vit` re-composes ``model`` (its type and class); otherwise it is lowered whole."""
    return type(model).__name__ in CLASSIFIERS.get(model.config.model_type, {})


class Logits(nn.Module):
    """A Hugging Face image classifier as ``pixel_values -> logits`` (its output's ``logits``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits


def input_shape(config: Any) -> tuple[int, int, int]:
    """``(channels, height, width)`` of the image a classifier of ``config`` takes (``config.num_channels``,
    ``config.image_size``, default 3 and 224)."""
    height, width = image_size(config) if hasattr(config, "image_size") else (224, 224)
    return getattr(config, "num_channels", 3), height, width


def sample_of(model: nn.Module) -> torch.Tensor:
    """One image of the size the checkpoint takes (:func:`input_shape`), at the model's dtype."""
    return torch.zeros(1, *input_shape(model.config), dtype=next(model.parameters()).dtype)


def lower_image_classifier(model: nn.Module, *, metadata: dict[str, Any] | None = None, **partitioner_options: Any):
    """Export and lower ``model`` to the method ``forward(pixel_values [1, C, H, W]) -> logits [1, labels]``.

    ViT and DeiT go through :mod:`.vit`; any other classifier is lowered
    whole.  Returns the ``EdgeProgramManager`` (:func:`coreai_partitioner.save_pte`
    writes it); ``metadata`` adds constant methods to ``get_image_size``
    (height, width) and ``get_num_channels``, which win where both name one.
    """
    from coreai_partitioner.lowering.lower import export_with_composites, reads_stack_traces
    from coreai_partitioner.lowering.methods import lower_methods

    pixels = sample_of(model)
    module = adapt(model) if adapted(model) else Logits(model)
    logger.info(
        "%s (%s): %s, an image of %s", model.config.model_type, type(model).__name__,
        "adapted" if adapted(model) else "lowered whole", "x".join(map(str, pixels.shape[1:])),
    )
    constants = {**(metadata or {}), "get_image_size": list(pixels.shape[2:]), "get_num_channels": pixels.shape[1]}
    exported = export_with_composites(module, (pixels,), stack_traces=reads_stack_traces(partitioner_options))
    return lower_methods([("forward", exported)], device=False, constant_methods=constants, **partitioner_options)


def write_image_processor(source: Any, directory: str | Path) -> Path:
    """``preprocessor_config.json`` beside the ``.pte`` in ``directory``: an image processor's ``save_pretrained``,
    or the file of a checkpoint directory ``source``.  Returns its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if hasattr(source, "save_pretrained"):
        source.save_pretrained(str(directory))
        return directory / PROCESSOR_FILE
    path = Path(source) / PROCESSOR_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{source} has no {PROCESSOR_FILE}: pass the image processor (AutoImageProcessor.from_pretrained) instead"
        )
    return Path(shutil.copy2(path, directory / PROCESSOR_FILE))
