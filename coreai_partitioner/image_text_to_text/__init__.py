"""Hugging Face vision-language models to one ``.pte`` for ExecuTorch's ``MultimodalRunner``, one Core AI asset.

The road of a checkpoint:

1. **Adapt** (:func:`adapt`, :mod:`.families`).  ``config.model_type`` picks
   the family file (Gemma 3, SmolVLM / Idefics3, LLaVA); it composes the
   vision tower from :mod:`coreai_partitioner.blocks`' encoder layer
   over the model's own modules (:mod:`.tower`: SDPA and ``layer_norm``
   composites), takes the projector, and has the text model adapted by its
   own text-decoder family (:func:`coreai_partitioner.text_decoder.adapt`).  A checkpoint
   without a vision config, a type no family adapts, a config value a family
   cannot honour, an image of more tokens than one decoder call takes: all
   refused here, from the config, before any weights are loaded.
2. **Export** (:func:`export_methods`).  The three methods the runner calls
   (:class:`.model.VisionLanguage`: ``vision_encoder``, ``token_embedding``,
   ``text_decoder``), each exported from the same module tree so a weight
   has one name in all three, composites externalized.
3. **Lower** (:func:`lower_vlm`).  One ``to_backend`` call; each method one
   delegate, a function of one shared Core AI asset (weights stored once);
   the runner's metadata as constant methods.
4. **Run** (:mod:`.run`): ExecuTorch's ``MultimodalRunner`` with an image, or
   the runner's calls in Python (:func:`.run.greedy`).
5. **Verify** (:mod:`.check`): image embeddings, prefill logits and greedy
   tokens against Hugging Face eager.

``python -m coreai_partitioner export --checkpoint DIR`` takes this road for
an ``image-text-to-text`` checkpoint (:mod:`coreai_partitioner.cli.tasks.image_text_to_text`).
"""

from coreai_partitioner import _compat  # noqa: F401 - first: it imports coreai-torch without coreai-torch's false version warning
from coreai_partitioner.image_text_to_text.errors import ImageTokensOverBound, UnsupportedImage, UnsupportedVisionConfig, UnsupportedVisionModel
from coreai_partitioner.image_text_to_text.export import METHODS, adapt, check_config, export_methods, lower_vlm, runner_metadata
from coreai_partitioner.image_text_to_text.families import family_of, supported, tiny_config
from coreai_partitioner.image_text_to_text.model import VisionLanguage

__all__ = [
    "METHODS",
    "ImageTokensOverBound",
    "UnsupportedImage",
    "UnsupportedVisionConfig",
    "UnsupportedVisionModel",
    "VisionLanguage",
    "adapt",
    "check_config",
    "export_methods",
    "family_of",
    "lower_vlm",
    "runner_metadata",
    "supported",
    "tiny_config",
]
