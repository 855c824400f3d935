"""One file per Hugging Face vision-language family, found by ``config.model_type``.

A family module defines:

- ``MODEL_TYPES``: the ``config.model_type`` values it adapts;
- ``build(model, shapes) -> VisionLanguage``: the tower, projector and text
  decoder over the model's own modules (the decoder is
  :func:`coreai_partitioner.text_decoder.adapt`'s, of the text model's own family);
- ``check(config, shapes)``: what the family refuses in a config, from the
  config alone (before any weights are loaded);
- ``image_tokens(config)``: how many embeddings one image is;
- ``tiny_config(model_type)`` and ``tiny_processor(config)``: a random
  2-layer model and the HF processor for it, with a tokenizer of one
  character per token (tests and examples).

A family's quirk lives in its file, as a subclass of a primitive of
:mod:`coreai_partitioner.blocks` or of :mod:`..tower` / :mod:`..model`.
Modules whose name starts with ``_`` are not families.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from coreai_partitioner.text_decoder.families import family_modules
from coreai_partitioner.image_text_to_text.errors import UnsupportedVisionModel


@functools.cache
def registry() -> dict[str, ModuleType]:
    """``model_type`` -> its family module."""
    return family_modules(__path__, __name__)


def supported() -> tuple[str, ...]:
    """Every ``model_type`` some vision family adapts, sorted."""
    return tuple(sorted(registry()))


def family_of(config: Any) -> ModuleType:
    """The family module for a vision-language ``config`` (or its ``model_type``); refuses, before any work,
    a config without a vision half and a type no family adapts."""
    model_type = config if isinstance(config, str) else getattr(config, "model_type", None)
    if not isinstance(config, str) and getattr(config, "vision_config", None) is None:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        raise UnsupportedVisionModel(
            f"{model_type}: the checkpoint has no vision_config, so it is not a vision-language model; export it "
            f"as text generation (python -m coreai_partitioner export --checkpoint DIR without --task, or export-llm; "
            f"its text model is {getattr(text, 'model_type', model_type)})"
        )
    family = registry().get(model_type)
    if family is None:
        raise UnsupportedVisionModel(
            f"model_type {model_type!r}: no coreai_partitioner.image_text_to_text family adapts it; vision-language families: "
            f"{', '.join(supported())}"
        )
    return family


def tiny_config(model_type: str) -> Any:
    """The family's tiny random config for ``model_type``."""
    return family_of(model_type).tiny_config(model_type)
