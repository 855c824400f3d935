"""The tiny random text-to-speech models: one a family (``--config vits``, ``--config kokoro``), each its family's
``tiny_config`` (:mod:`.families`)."""

from __future__ import annotations

from typing import Any


def names() -> list[str]:
    """``--config`` names of the tiny random text-to-speech models: every family's ``NAME``."""
    from coreai_partitioner.text_to_speech.families import names

    return names()


def tiny_config(name: str = "vits") -> Any:
    from coreai_partitioner.text_to_speech.families import registry

    if name not in registry():
        raise ValueError(f"no tiny text-to-speech config {name!r}; choose one of {', '.join(registry())}")
    return registry()[name].tiny_config()


def tiny_model(config: Any) -> Any:
    """The seeded tiny model of ``config`` in fp32 (no family has an auto class to make it from a config)."""
    import torch

    from coreai_partitioner.text_to_speech.families import family_of

    family = family_of(config)
    torch.manual_seed(0)
    return family.tiny_model(config)
