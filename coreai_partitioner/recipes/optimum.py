"""optimum-executorch recipes that export with this project's LLM path: ``coreai``, ``coreai_fp16``, one per weight
scheme, and ``coreai_device``.

optimum-executorch 1.1.0 finds recipes only in its own package
(``discover_recipes`` imports ``optimum.exporters.executorch.recipes.*``), but
keeps every recipe ever registered, so importing this module is enough::

    import coreai_partitioner.recipes.optimum  # registers the recipes and the host Core AI runtime backend
    from optimum.executorch import ExecuTorchModelForCausalLM
    model = ExecuTorchModelForCausalLM.from_pretrained("path/to/checkpoint", recipe="coreai", task="text-generation")
    model.text_generation(tokenizer, "Hello", max_seq_len=64)

From the shell, ``python -m coreai_partitioner export-optimum --model DIR
--recipe coreai --output-dir OUT`` does what ``optimum-cli export executorch``
does with the recipe registered first (optimum-cli cannot discover a recipe
outside its package).

A recipe takes optimum's ``CausalLMExportableModule`` and lowers its
Hugging Face model with :func:`coreai_partitioner.text_generation.lower_decoder`: one
Core AI delegate with the composites, the caches as its state, and
ExecuTorch's runner metadata.  ``forward(input_ids [1, T], cache_position [T])``
returns the last position's logits, which optimum's ``generate`` reads
(``argmax(logits)[0, -1]``).  The context is optimum's ``max_seq_len``, and
one call takes a prompt that long (optimum prefills in one call when the
method's second input takes more than one position).  ``coreai_device``
exports the device form (:mod:`coreai_partitioner.text_decoder.device`), which
upstream's on-device runtime loads: its ``forward`` takes a bounded number
of tokens, the whole context, or a model's smallest sliding window where it
has one (the device form writes a call's rows into a ring at once), so
optimum and ExecuTorch's runner prefill a prompt in one call or in chunks of
that window.  Needs the transformers optimum-executorch pins (5.0.0rc1).

optimum's ``fill-mask`` and ``image-classification`` tasks hand the recipe
their ``MaskedLMExportableModule`` and ``VisionEncoderExportableModule``:
``coreai`` exports a BERT-class masked LM with :mod:`coreai_partitioner.text_encoder`
and a ViT or DeiT with :mod:`coreai_partitioner.image_classification`
(``forward(input_ids, attention_mask)`` and ``forward(pixel_values)``, what
``ExecuTorchModelForMaskedLM`` and ``ExecuTorchModelForImageClassification``
call), and lowers any other model of those tasks whole, as the XNNPACK
recipe lowers optimum's program.  Its ``text2text-generation`` task hands
over a ``Seq2SeqLMExportableModule``: ``coreai`` exports a T5 or Flan-T5 with
:mod:`coreai_partitioner.text2text` (``encoder(input_ids)`` with ``T`` up to
optimum's ``max_hidden_seq_len``, ``text_decoder(ids, encoder output,
cache_position)`` over a cache of its ``max_seq_len``, what
``ExecuTorchModelForSeq2SeqLM`` calls).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

#: recipe name -> (dtype the model is cast to, or None for as loaded; weight quantization; target)
RECIPES = {
    "coreai": (None, None, "host"),
    "coreai_fp16": ("float16", None, "host"),
    "coreai_int8": (None, "int8", "host"),
    "coreai_int4": (None, "int4", "host"),
    "coreai_int4_channel": (None, "int4-channel", "host"),
    "coreai_palettize4": (None, "palettize4", "host"),
    "coreai_palettize8": (None, "palettize8", "host"),
    "coreai_palettize4_mixed": (None, "palettize4-mixed", "host"),
    "coreai_device": (None, None, "device"),
    "coreai_device_palettize4": (None, "palettize4", "device"),
}

def export(
    model: Any, *, dtype: str | None = None, quantize: str | None = None, target: str = "host", **kwargs: Any
) -> dict[str, Any]:
    """An optimum-executorch recipe: ``{"model": ExecutorchProgramManager}`` of ``model`` (its exportable wrapper)."""
    from coreai_partitioner import text_generation

    if kwargs:
        logger.info("coreai recipe: ignoring %s", ", ".join(sorted(kwargs)))
    hf_model = getattr(model, "model", model)
    if dtype is not None:
        hf_model = hf_model.to(getattr(torch, dtype))
    metadata = getattr(model, "metadata", {}) or {}
    encoder_task = _encoder_task(model)
    if encoder_task is not None:
        return {"model": _export_encoder(hf_model, encoder_task, quantize, target, metadata).to_executorch()}
    if _is_seq2seq(model):
        return {"model": _export_text2text(model, hf_model, quantize, target, metadata).to_executorch()}
    vision_model = getattr(hf_model.config, "vision_config", None) is not None
    audio_model = getattr(hf_model.config, "audio_config", None) is not None
    multimodal = vision_model or audio_model
    # optimum's multimodal loader sizes its cache by max_length (its generation config), not max_seq_len.
    context = int(metadata.get("get_max_seq_len") or (multimodal and hf_model.generation_config.max_length) or 2048)
    if multimodal:
        context = min(context, hf_model.config.get_text_config().max_position_embeddings)
    shapes = text_generation.DecoderShapes(max_context_len=context, prefill_chunk=context, target=target)
    if vision_model:
        return {"model": _export_vision(hf_model, shapes, quantize, metadata).to_executorch()}
    if audio_model:
        return {"model": _export_audio(hf_model, shapes, quantize, metadata).to_executorch()}
    decoder = text_generation.adapt(hf_model, shapes)
    if target == "device":
        from coreai_partitioner.text_decoder.device import sliding_windows

        shapes = dataclasses.replace(shapes, prefill_chunk=min([context, *sliding_windows(decoder)]))
    lowered = text_generation.lower_decoder(hf_model, shapes, quantize=quantize, decoder=decoder)
    return {"model": lowered.to_executorch()}


def _encoder_task(model: Any) -> str | None:
    """``fill-mask`` or ``image-classification`` when optimum hands over that task's exportable module, else None."""
    from optimum.exporters.executorch.integrations import MaskedLMExportableModule, VisionEncoderExportableModule

    if isinstance(model, MaskedLMExportableModule):
        return "fill-mask"
    if isinstance(model, VisionEncoderExportableModule):
        return "image-classification"
    return None


def _is_seq2seq(model: Any) -> bool:
    """Whether optimum hands over its ``text2text-generation`` (or speech) exportable module."""
    from optimum.exporters.executorch.integrations import Seq2SeqLMExportableModule

    return isinstance(model, Seq2SeqLMExportableModule)


def _export_text2text(model: Any, hf_model: Any, quantize: str | None, target: str, metadata: dict[str, Any]) -> Any:
    """optimum's ``text2text-generation`` model by :func:`coreai_partitioner.text2text.lower_text2text`: its cache
    ``max_seq_len`` slots, its inputs up to ``max_hidden_seq_len`` tokens, optimum's metadata kept beside ours."""
    from coreai_partitioner import text2text

    if quantize is not None:
        raise ValueError(
            f"{hf_model.config.model_type} text2text-generation: the coreai recipes export it unquantized; use "
            "recipe='coreai', 'coreai_fp16' or 'coreai_device'"
        )
    return text2text.lower_text2text(
        hf_model, target=target, max_decode_len=model.max_seq_len, max_input_len=model.max_hidden_seq_len,
        metadata=_constants(metadata),
    )


def _constants(metadata: dict[str, Any]) -> dict[str, Any]:
    """optimum's metadata that a constant method can return; optimum copies the processor's dicts in too."""

    def constant(value: Any) -> bool:
        values = value if isinstance(value, list) else [value]
        return bool(values) and all(isinstance(v, (bool, int, float, str)) for v in values)

    return {name: value for name, value in metadata.items() if constant(value)}


def _export_encoder(hf_model: Any, task: str, quantize: str | None, target: str, metadata: dict[str, Any]) -> Any:
    """optimum's ``fill-mask`` and ``image-classification`` models: ``forward(input_ids, attention_mask)`` and
    ``forward(pixel_values)``, the methods ``ExecuTorchModelForMaskedLM`` and ``...ForImageClassification`` call.

    A BERT-class masked LM goes through :mod:`coreai_partitioner.text_encoder` (``T`` dynamic up to the positions
    it numbers, as optimum exports it), a ViT or DeiT through :mod:`coreai_partitioner.image_classification`; any
    other model is lowered whole by :func:`coreai_partitioner.lower`, as the XNNPACK recipe lowers optimum's program.
    """
    from coreai_partitioner import image_classification, lower, text_encoder

    if quantize is not None or target != "host":
        raise ValueError(
            f"{hf_model.config.model_type} {task}: the coreai recipes export encoder tasks unquantized for the host "
            "runtime; use recipe='coreai' (or 'coreai_fp16')"
        )
    extra = _constants(metadata)
    if task == "image-classification":
        return image_classification.lower_image_classifier(hf_model, metadata=extra)
    if hf_model.config.model_type in text_encoder.supported():
        return text_encoder.lower_text_encoder(hf_model, "fill-mask", metadata=extra)
    logger.info("coreai recipe: %s is not a text encoder this package adapts; lowered whole", hf_model.config.model_type)
    tokens = torch.ones(1, 2, dtype=torch.long)
    length = torch.export.Dim("T", min=1, max=max(2, hf_model.config.max_position_embeddings - 1))
    return lower(_MaskedLMLogits(hf_model), (tokens, tokens), dynamic_shapes=({1: length}, {1: length}), constant_methods=extra)


class _MaskedLMLogits(torch.nn.Module):
    """A Hugging Face masked LM as ``(input_ids, attention_mask) -> logits``, what optimum's program computes."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def _export_vision(hf_model: Any, shapes: Any, quantize: str | None, metadata: dict[str, Any]) -> Any:
    """optimum's ``image-text-to-text`` model by :func:`coreai_partitioner.image_text_to_text.lower_vlm`, optimum's metadata kept.

    ``ExecuTorchModelForMultiModalToText`` prefills the whole prompt in one
    ``text_decoder`` call (the token embeddings with the ``vision_encoder``'s
    rows written over the image placeholders), so one call takes the whole
    context; it reads ``modality``, ``vision_token_id`` and ``get_eos_id``.
    """
    from coreai_partitioner import image_text_to_text

    extra = _constants(metadata)
    eos = hf_model.config.get_text_config().eos_token_id
    extra.setdefault("get_eos_id", eos[0] if isinstance(eos, list) else eos)
    return image_text_to_text.lower_vlm(hf_model, shapes, quantize=quantize, metadata=extra)


def _export_audio(hf_model: Any, shapes: Any, quantize: str | None, metadata: dict[str, Any]) -> Any:
    """optimum's ``multimodal-text-to-text`` model of the audio modality (Voxtral) by
    :func:`coreai_partitioner.audio_text_to_text.lower_audio_language`, optimum's metadata kept.

    ``ExecuTorchModelForMultiModalToText`` prefills the whole prompt in one
    ``text_decoder`` call (the token embeddings with ``audio_encoder``'s rows
    written over the audio placeholders) and reads ``modality``,
    ``audio_token_id`` and ``get_eos_id``.  ``audio_encoder`` takes one 30 s
    window: optimum's ``input_features`` of a recording up to 30 s.
    """
    from coreai_partitioner import audio_text_to_text

    extra = _constants(metadata)
    extra.setdefault("modality", "audio")
    extra.setdefault("audio_token_id", hf_model.config.audio_token_id)
    eos = hf_model.config.get_text_config().eos_token_id
    extra.setdefault("get_eos_id", eos[0] if isinstance(eos, list) else eos)
    return audio_text_to_text.lower_audio_language(hf_model, shapes, quantize=quantize, metadata=extra)


def register() -> list[str]:
    """Register the recipes with optimum-executorch and the host Core AI backend with ExecuTorch; their names."""
    from optimum.exporters.executorch.recipe_registry import register_recipe

    from coreai_partitioner import load_runtime_backend

    for name, (dtype, quantize, target) in RECIPES.items():
        register_recipe(name)(functools.partial(export, dtype=dtype, quantize=quantize, target=target))
    load_runtime_backend()  # optimum loads the .pte with ExecuTorch's _load_for_executorch
    return list(RECIPES)


def main_export(model: str, output_dir: str, recipe: str = "coreai", **kwargs: Any) -> Any:
    """optimum-executorch's ``main_export`` for a causal LM, the coreai recipes registered first."""
    from optimum.exporters.executorch import main_export as optimum_export

    if recipe not in RECIPES:
        raise ValueError(f"no recipe named {recipe!r}; this project's are {', '.join(RECIPES)}")
    register()
    return optimum_export(model, task="text-generation", recipe=recipe, output_dir=output_dir, **kwargs)


register()
