"""Image classifiers to one ``.pte`` whose ``forward(pixel_values)`` gives the logits, optimum-executorch's convention.

The road of a checkpoint:

1. **Adapt** (:mod:`.vit`).  ViT (``ViTForImageClassification``) and DeiT
   (``DeiTForImageClassification``, ``...WithTeacher``) are re-composed over
   the model's own modules: patch tokens, then
   :class:`~coreai_partitioner.blocks.EncoderLayer` layers (pre-norm;
   SDPA composite, not causal; HF's LayerNorms, which coreai-torch converts
   to its ``layer_norm`` composite), the final LayerNorm, the classifier.
   Any other image classifier (ConvNeXt, MobileViT, ResNet...) is not
   refused: it is lowered whole as a plain model.
2. **Lower** (:func:`lower_image_classifier`): one image of the
   checkpoint's size, as optimum exports it.
3. **Beside it** (:func:`write_image_processor`): ``preprocessor_config.json``.

:mod:`.tiny` makes tiny random ViT and DeiT classifiers and their processor.
"""

from coreai_partitioner import _compat  # noqa: F401 - first: it imports coreai-torch without coreai-torch's false version warning
from coreai_partitioner.image_classification.export import (
    PROCESSOR_FILE,
    Logits,
    adapted,
    input_shape,
    lower_image_classifier,
    sample_of,
    write_image_processor,
)
from coreai_partitioner.image_classification.vit import CLASSIFIERS, ImageClassifier, PatchTokens, adapt, image_size

__all__ = [
    "CLASSIFIERS",
    "PROCESSOR_FILE",
    "ImageClassifier",
    "Logits",
    "PatchTokens",
    "adapt",
    "adapted",
    "image_size",
    "input_shape",
    "lower_image_classifier",
    "sample_of",
    "write_image_processor",
]
