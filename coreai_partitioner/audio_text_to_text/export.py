"""One ``.pte`` for ExecuTorch's ``MultimodalRunner``: ``audio_encoder``, ``token_embedding``, ``text_decoder`` over one
Core AI asset, and the runner's metadata.

:func:`lower_audio_language` adapts a Hugging Face audio-language model
(:func:`adapt`: its family's tower, projector and the text model's decoder),
exports each method with its composites externalized
(:func:`coreai_partitioner.text_decoder.multimodal.export_methods`) and lowers
the three in one ``to_backend`` call (:func:`coreai_partitioner.lowering.methods.lower_methods`):
each method is one delegate, a function of one shared Core AI asset.

The host form (the default): ``text_decoder`` takes ``S`` from 1 to
``shapes.prefill_chunk`` (a window's embeddings, or a prompt segment, in one
call) and its caches are the delegate's Core AI state.  The device form
(``shapes.target == "device"``): the caches are the program's buffers
(:mod:`.device`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from coreai_partitioner.audio_text_to_text.errors import AudioTokensOverBound
from coreai_partitioner.audio_text_to_text.families import family_of
from coreai_partitioner.audio_text_to_text.model import AudioLanguage
from coreai_partitioner.text_decoder.shapes import DecoderShapes

logger = logging.getLogger(__name__)

#: The methods of the ``.pte``, in the order they are lowered: the runner's names (``extension/llm/runner/constants.h``).
METHODS = ("audio_encoder", "token_embedding", "text_decoder")


def check_config(config: Any, shapes: DecoderShapes) -> Any:
    """Refuse, from the config alone and before any weights are read, what this path cannot export; the family.

    A config without an audio half, a type whose encoder or decoder is not
    lowered, a config value the family cannot honour, the device form's
    static layout, and a window of more embeddings than one ``text_decoder``
    call takes (the runner never splits a segment) or than the context holds.
    """
    from coreai_partitioner.text_decoder import UnsupportedShapes
    from coreai_partitioner.text_decoder import family_of as text_family_of

    family = family_of(config)
    text_family_of(config.get_text_config().model_type)
    if shapes.device and not shapes.bounded:
        raise UnsupportedShapes(
            f"{config.model_type}: MultimodalRunner calls text_decoder with each segment's own length, which the "
            "device form's static layout cannot take; use its bounded layout (device_shapes='bounded', the default)"
        )
    family.check(config, shapes)
    tokens = family.audio_tokens(config)
    if tokens > shapes.prefill_chunk:
        raise AudioTokensOverBound(
            f"{config.model_type}: one audio window is {tokens} embeddings, which the runner hands text_decoder in one "
            f"call, and text_decoder takes at most {shapes.prefill_chunk} a call; export with --prefill-chunk {tokens} or more"
        )
    if tokens >= shapes.max_context_len:
        raise AudioTokensOverBound(
            f"{config.model_type}: one audio window is {tokens} embeddings and the context holds "
            f"{shapes.max_context_len} positions; export with --max-context-len above {tokens}"
        )
    return family


def adapt(model: nn.Module, shapes: DecoderShapes) -> AudioLanguage:
    """The :class:`~.model.AudioLanguage` of ``model``'s family over its own weights (:func:`check_config` first)."""
    family = check_config(model.config, shapes)
    alm = family.build(model, shapes)
    logger.info(
        "%s: an audio tower of %d layer(s), %d embeddings a window of %dx%d features, a %s decoder of %d layer(s)",
        alm.model_type, len(getattr(alm.tower, "layers", ())), alm.audio_tokens, alm.bins, alm.frames,
        alm.decoder.model_type, len(alm.decoder.layers),
    )
    return alm


def samples(alm: AudioLanguage, shapes: DecoderShapes) -> dict[str, tuple[tuple[torch.Tensor, ...], Any]]:
    """Each method's sample inputs and dynamic shapes: one window static, ``n`` and ``S`` from 1 to the chunk."""
    from coreai_partitioner.text_decoder.multimodal import text_samples

    features = torch.zeros(1, alm.bins, alm.frames, dtype=torch.float32)
    return {"audio_encoder": ((features,), None), **text_samples(alm, shapes.prefill_chunk)}


def export_methods(
    alm: AudioLanguage, shapes: DecoderShapes, *, decompositions: dict | None = None, quantize: Any = None
) -> dict[str, tuple]:
    """``{method: (exported_program, records)}``, the device form's methods (:class:`~.device.DeviceAudioLanguage`)
    where ``shapes.device``.  ``quantize`` stores every weight of the text decoder compressed (refused, before
    any work, where one does not fit); the audio tower and projector stay float."""
    from coreai_partitioner.quantize import check_model
    from coreai_partitioner.text_decoder import multimodal

    methods: nn.Module = alm
    if shapes.device:
        from coreai_partitioner.audio_text_to_text.device import DeviceAudioLanguage

        methods = DeviceAudioLanguage(alm)
    kept: list[str] = []
    if quantize:
        check_model(alm.decoder, quantize)
        prefix = "" if methods is alm else "model."
        kept = [prefix + part for part in ("tower", "projector")]
    return multimodal.export_methods(
        methods, samples(alm, shapes), device=shapes.device, decompositions=decompositions, quantize=quantize, keep_float=kept
    )


def runner_metadata(model: nn.Module, alm: AudioLanguage, shapes: DecoderShapes) -> dict[str, Any]:
    """The constant methods ``MultimodalRunner`` reads (``get_max_seq_len`` required), and the audio's.

    ``get_audio_window`` (bins and frames) and ``get_audio_tokens`` (a
    window's embeddings) and ``get_audio_token_id`` tell an app what
    ``audio_encoder`` takes and where its output goes; the feature
    extractor's settings are in ``preprocessor_config.json`` beside the ``.pte``.
    """
    from coreai_partitioner.text_decoder import runner_metadata as text_metadata

    metadata = text_metadata(model, shapes)
    metadata.update(
        get_audio_window=[alm.bins, alm.frames], get_audio_tokens=alm.audio_tokens, get_audio_token_id=alm.audio_token_id
    )
    return metadata


def lower_audio_language(
    model: nn.Module,
    shapes: DecoderShapes,
    *,
    alm: AudioLanguage | None = None,
    quantize: Any = None,
    metadata: dict[str, Any] | None = None,
    quantized_reference: dict | None = None,
    **partitioner_options: Any,
):
    """Export and lower ``model``'s three methods to one Core AI asset, with the runner's metadata.

    Returns the ``EdgeProgramManager`` (``.to_executorch()`` gives the
    ``.pte``).  ``alm`` is :func:`adapt`'s, when the caller made it already.
    The caches are emptied first.  ``metadata`` adds constant methods to :func:`runner_metadata`'s, which win
    where both name one.  A dict passed as ``quantized_reference`` gets, under
    ``quantize``, each method's quantized eager program.
    """
    from coreai_partitioner.text_decoder.multimodal import lower_embedded

    alm = alm if alm is not None else adapt(model, shapes)
    return lower_embedded(
        alm, shapes, lambda decompositions: export_methods(alm, shapes, decompositions=decompositions, quantize=quantize),
        constant_methods={**(metadata or {}), **runner_metadata(model, alm, shapes)}, quantize=quantize,
        quantized_reference=quantized_reference, **partitioner_options,
    )
