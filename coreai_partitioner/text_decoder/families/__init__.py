"""One file per Hugging Face family, found by ``config.model_type``.

A family module defines:

- ``MODEL_TYPES``: the ``config.model_type`` values it adapts;
- ``build(build: Build) -> Decoder``: the decoder over the model's own
  modules (:class:`~coreai_partitioner.text_decoder.recompose.Build` has the shared pieces);
- ``tiny_config(model_type) -> PretrainedConfig``: a few-layer random config
  exercising every feature the adapter handles (tests and examples);
- optionally ``first_layers(text_config, total, layers)``: what else to cut
  when ``--num-layers`` keeps only the first ``layers`` of ``total``.

A family's quirk lives in its file: a subclass of a primitive of
:mod:`coreai_partitioner.blocks` (``kind=`` to :class:`~coreai_partitioner.text_decoder.recompose.Build`'s
builders), never an option of the primitive.

Adding a family is adding its file here (and a row to the family test).
Modules whose name starts with ``_`` are not families.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from types import ModuleType
from typing import Any

from torch import nn


class UnsupportedModel(ValueError):
    """A model no family adapts; names its ``model_type``, the families, and the way out."""


def family_modules(path: Any, package: str) -> dict[str, ModuleType]:
    """``model_type`` -> its family module, over the modules of the package ``package`` at ``path`` (its
    ``__path__``) whose names do not start with ``_``: each names the types it adapts in ``MODEL_TYPES``."""
    families: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(path), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for model_type in module.MODEL_TYPES:
            families[model_type] = module
    return families


@functools.cache
def registry() -> dict[str, ModuleType]:
    """``model_type`` -> its family module."""
    return family_modules(__path__, __name__)


def supported() -> tuple[str, ...]:
    """Every ``model_type`` some family adapts, sorted."""
    return tuple(sorted(registry()))


def model_type_of(model: Any) -> str | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "model_type", None) or getattr(config, "model_type", None)


def family_of(model: nn.Module | str) -> ModuleType:
    """The family module that adapts ``model`` (or a ``model_type``); raises :class:`UnsupportedModel`."""
    model_type = model if isinstance(model, str) else model_type_of(model)
    family = registry().get(model_type)
    if family is None:
        what = f"model_type {model!r}" if isinstance(model, str) else f"{type(model).__name__} (model_type {model_type!r})"
        raise UnsupportedModel(
            f"no coreai_partitioner.text_decoder family adapts {what}; families: {', '.join(supported())}. "
            "To export it anyway, keep its composites with your own specs: "
            "coreai_partitioner.lower(model, sample, specs=[*default_specs(), ExternalizeSpec(YourNorm, "
            "composite_op_name='rms_norm', composite_attrs=['eps'])])"
        )
    return family


def tiny_config(model_type: str) -> Any:
    """The family's tiny random config for ``model_type`` (see the module docstring)."""
    return family_of(model_type).tiny_config(model_type)
