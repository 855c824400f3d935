"""A Hugging Face text decoder re-composed of :mod:`coreai_partitioner.blocks` over its own weights: the room every task
that generates text shares, and no task's own.  Text generation and a vision-language model's text half adapt a model
here; speech recognition and text-to-text generation take its device form and its tokenizer.

- :mod:`.families`: a file per Hugging Face family, found by ``config.model_type``; its quirks as subclasses of the
  primitives;
- :mod:`.recompose`: :func:`adapt` (a model to its family's :class:`Decoder`), :class:`~.recompose.Build` (what a family
  builds with), :func:`first_layers`;
- :mod:`.decoder`: :class:`Decoder`, the step a runner calls, over caches it owns;
- :mod:`.device`: the step in the form upstream's on-device runtime runs (caches owned by ExecuTorch);
- :mod:`.shapes`: :class:`DecoderShapes`, the limits it is exported for, and :func:`runner_metadata`, which tells a
  runner them;
- :mod:`.export`: :func:`~.export.export_decoder`, the decoder exported with its composites (a task lowers it);
- :mod:`.slots`: LoRA adapter slots on its linear layers, each pair an input of the program (the rest of LoRA:
  :mod:`coreai_partitioner.adapters`);
- :mod:`.tokenizer`: the checkpoint's tokenizer, checked as ExecuTorch's runners load it.
"""

from coreai_partitioner import _compat  # noqa: F401 - first: it imports coreai-torch without coreai-torch's false version warning
from coreai_partitioner.blocks.errors import UnsupportedConfig
from coreai_partitioner.text_decoder.recompose import adapt, first_layers
from coreai_partitioner.text_decoder.decoder import Decoder, reset_state
from coreai_partitioner.text_decoder.families import UnsupportedModel, family_of, supported, tiny_config
from coreai_partitioner.text_decoder.shapes import DEVICE_SHAPES, SHAPE_MODES, TARGETS, DecoderShapes, UnsupportedShapes, runner_metadata

__all__ = [
    "DEVICE_SHAPES",
    "SHAPE_MODES",
    "TARGETS",
    "Decoder",
    "DecoderShapes",
    "UnsupportedConfig",
    "UnsupportedModel",
    "UnsupportedShapes",
    "adapt",
    "family_of",
    "first_layers",
    "reset_state",
    "runner_metadata",
    "supported",
    "tiny_config",
]
