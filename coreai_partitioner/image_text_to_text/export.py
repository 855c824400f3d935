"""One ``.pte`` for ExecuTorch's ``MultimodalRunner``: the three methods over one Core AI asset, and its metadata.

:func:`lower_vlm` adapts a Hugging Face vision-language model (:func:`adapt`:
its family's tower, projector and the text model's decoder), exports
each method of the :class:`~.model.VisionLanguage` with its composites
externalized (:func:`export_methods`), and lowers the three in one
``to_backend`` call, each partitioner asking to share the asset: each method
is one delegate, a function of one Core AI asset, and a weight two methods
use (the token embedding, which a tied head reads too) is stored once.  The
runner's metadata rides along as constant methods (:func:`runner_metadata`).

The host form (the default): ``text_decoder`` takes ``S`` from 1 to
``shapes.prefill_chunk`` (an image's tokens, or a prompt segment, in one
call) and its caches are the delegate's Core AI state, as an LLM's host form's.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from coreai_partitioner.text_decoder.shapes import DecoderShapes
from coreai_partitioner.image_text_to_text.errors import ImageTokensOverBound
from coreai_partitioner.image_text_to_text.families import family_of
from coreai_partitioner.image_text_to_text.model import VisionLanguage

logger = logging.getLogger(__name__)

#: The methods of the ``.pte``, in the order they are lowered: the runner's names (``extension/llm/runner/constants.h``).
METHODS = ("vision_encoder", "token_embedding", "text_decoder")


def check_config(config: Any, shapes: DecoderShapes) -> Any:
    """Refuse, from the config alone and before any weights are loaded, what this path cannot export; the family.

    A config without a vision half, a type no family adapts, a config value
    the family cannot honour, the device form's static layout, and an image of more tokens than one
    ``text_decoder`` call takes (the runner never splits a segment) or than
    the context holds.
    """
    from coreai_partitioner.text_decoder import UnsupportedShapes
    from coreai_partitioner.text_decoder import family_of as text_family_of

    family = family_of(config)
    if shapes.device and not shapes.bounded:
        raise UnsupportedShapes(
            f"{config.model_type}: MultimodalRunner calls text_decoder with each segment's own length, which the "
            "device form's static layout cannot take; use its bounded layout (device_shapes='bounded', the default)"
        )
    family.check(config, shapes)
    text_family_of(config.get_text_config().model_type)
    tokens = family.image_tokens(config)
    if tokens > shapes.prefill_chunk:
        raise ImageTokensOverBound(
            f"{config.model_type}: one image is {tokens} embeddings, which the runner hands text_decoder in one call, "
            f"and text_decoder takes at most {shapes.prefill_chunk} a call; export with --prefill-chunk {tokens} or more"
        )
    if tokens >= shapes.max_context_len:
        raise ImageTokensOverBound(
            f"{config.model_type}: one image is {tokens} embeddings and the context holds {shapes.max_context_len} "
            f"positions; export with --max-context-len above {tokens}"
        )
    return family


def adapt(model: nn.Module, shapes: DecoderShapes) -> VisionLanguage:
    """The :class:`~.model.VisionLanguage` of ``model``'s family over its own weights (:func:`check_config` first)."""
    family = check_config(model.config, shapes)
    vlm = family.build(model, shapes)
    if shapes.device:
        check_device_windows(vlm, shapes)
    logger.info(
        "%s: a tower of %d layer(s), %d image token(s) of %s, a %s decoder of %d layer(s)",
        vlm.model_type, len(getattr(vlm.tower, "layers", ())), vlm.image_tokens, "x".join(map(str, vlm.image_size)),
        vlm.decoder.model_type, len(vlm.decoder.layers),
    )
    return vlm


def check_device_windows(vlm: VisionLanguage, shapes: DecoderShapes) -> None:
    """Refuse a device-form ``text_decoder`` call (``--prefill-chunk``) longer than the decoder's smallest sliding
    window, whose ring takes a call's rows at once; an image longer than the window fits no call of this form."""
    from coreai_partitioner.text_decoder.device import UnsupportedDevice, sliding_windows

    windows = sliding_windows(vlm.decoder)
    if not windows or shapes.prefill_chunk <= windows[0]:
        return
    window = windows[0]
    if vlm.image_tokens > window:
        raise UnsupportedDevice(
            f"{vlm.model_type}: one image is {vlm.image_tokens} embeddings, which the runner hands text_decoder in one "
            f"call, and the device form's calls are at most its smallest sliding window ({window}), whose ring takes a "
            "call's rows at once; no --prefill-chunk fits both: export it in the host form (--target host)"
        )
    raise UnsupportedDevice(
        f"{vlm.model_type}: the device form writes a text_decoder call's rows into each sliding window's ring at once, "
        f"and --prefill-chunk {shapes.prefill_chunk} is longer than its smallest window ({window}); export with "
        f"--prefill-chunk {window} or less (one image is {vlm.image_tokens} embeddings)"
    )


def samples(vlm: VisionLanguage, shapes: DecoderShapes) -> dict[str, tuple[tuple[torch.Tensor, ...], Any]]:
    """Each method's sample inputs and dynamic shapes: the image static, ``n`` and ``S`` from 1 to the chunk."""
    from coreai_partitioner.text_decoder.multimodal import text_samples

    height, width = vlm.image_size
    pixels = torch.zeros(1, 3, height, width, dtype=torch.float32)
    return {"vision_encoder": ((pixels,), None), **text_samples(vlm, shapes.prefill_chunk)}


def export_methods(
    vlm: VisionLanguage, shapes: DecoderShapes, *, decompositions: dict | None = None, quantize: Any = None
) -> dict[str, tuple]:
    """``{method: (exported_program, records)}``: each method exported with its composites externalized.

    In the device form (``shapes.target``) the methods are
    :class:`~.device.DeviceVisionLanguage`'s, their boundary annotations kept.
    ``quantize`` (a scheme of :data:`coreai_partitioner.quantize.SCHEMES`)
    stores the weights outside the composites compressed: every weight of the
    text decoder (refused, before any work, if one does not fit the scheme),
    and of the tower and projector those that fit (:func:`tower_kept_float`).
    Each method's program is quantized by the same scheme, so a weight two
    methods read (the token embedding, a tied head) is the same compressed
    tensor in both, stored once (:func:`coreai_partitioner.text_decoder.multimodal.export_methods`).
    """
    from coreai_partitioner.text_decoder import multimodal

    kept = tower_kept_float(vlm, quantize) if quantize else []
    methods: nn.Module = vlm
    if shapes.device:
        from coreai_partitioner.image_text_to_text.device import DeviceVisionLanguage

        methods = DeviceVisionLanguage(vlm)
    prefix = "" if methods is vlm else "model."  # the program names weights from the methods' root
    return multimodal.export_methods(
        methods, samples(vlm, shapes), device=shapes.device, decompositions=decompositions, quantize=quantize,
        keep_float=[prefix + path for path in kept],
    )


def tower_kept_float(vlm: VisionLanguage, scheme: Any) -> list[str]:
    """The tower's and projector's layers ``scheme`` cannot store, kept float and said so in a warning.

    The text decoder's weights must all fit: one that does not is refused
    here, before any export work, naming it and the ways out
    (:func:`coreai_partitioner.quantize.check_model`).  A tower's shapes are
    its own (a patch convolution over 3 channels, a width no int4 block
    divides), so there the scheme applies where it fits
    (:func:`coreai_partitioner.quantize.keep_unstorable_float`, as for any
    model).  The position embeddings, added whole to the patches rather than
    looked up, stay float (SigLIP's at 896x896: 4096 x 1152, 0.5% of Gemma 3 4B's tower).
    """
    import dataclasses

    from coreai_partitioner.quantize import check_model, keep_unstorable_float, stored_weights

    check_model(vlm.decoder, scheme)
    embeddings = getattr(vlm.tower, "embeddings", None)
    table = "tower.embeddings.position_embedding" if embeddings is not None and embeddings.position_ids is None else None
    weights = [
        dataclasses.replace(w, name=f"{part}.{w.name}", layer=f"{part}.{w.layer}" if w.layer else part)
        for part in ("tower", "projector")
        for w in stored_weights(getattr(vlm, part), scheme)
    ]
    kept = keep_unstorable_float(
        [w for w in weights if w.layer != table], getattr(scheme, "name", scheme), model=vlm.model_type,
        part="the vision tower and projector", stacklevel=3,
    )
    return kept + ([table] if table is not None else [])


def runner_metadata(model: nn.Module, vlm: VisionLanguage, shapes: DecoderShapes) -> dict[str, Any]:
    """The constant methods ``MultimodalRunner`` reads (``get_max_seq_len`` required), and the image's.

    ``get_max_seq_len`` is the most embeddings one ``text_decoder`` call
    takes (an image's, or a prompt segment's), ``get_max_context_len`` the
    cache length.  ``get_image_size`` (height and width),
    ``get_image_tokens`` and ``get_image_token_id`` tell an app what
    ``vision_encoder`` takes and where its output goes; the processor's
    normalization is in ``preprocessor_config.json`` beside the ``.pte``.
    """
    from coreai_partitioner.text_decoder import runner_metadata as text_metadata

    metadata = text_metadata(model, shapes)
    metadata.update(
        get_image_size=list(vlm.image_size), get_image_tokens=vlm.image_tokens, get_image_token_id=vlm.image_token_id
    )
    return metadata


def lower_vlm(
    model: nn.Module,
    shapes: DecoderShapes,
    *,
    vlm: VisionLanguage | None = None,
    quantize: Any = None,
    metadata: dict[str, Any] | None = None,
    quantized_reference: dict | None = None,
    **partitioner_options: Any,
):
    """Export and lower ``model``'s three methods to one Core AI asset, with the runner's metadata.

    Returns the ``EdgeProgramManager`` (``.to_executorch()`` gives the
    ``.pte``).  ``vlm`` is :func:`adapt`'s, when the caller made it already;
    ``quantize`` is :func:`export_methods`'.  ``metadata`` adds constant
    methods to :func:`runner_metadata`'s, which win where both name one
    (optimum-executorch's ``modality``, ``vision_token_id``).  A dict passed
    as ``quantized_reference`` gets, under ``quantize``, each method's
    quantized eager program (``{method: GraphModule}``, what ``--verify``
    judges the ``.pte`` against; :meth:`.run.Methods.of` runs it).
    """
    from coreai_partitioner.text_decoder.multimodal import lower_embedded

    vlm = vlm if vlm is not None else adapt(model, shapes)
    return lower_embedded(
        vlm, shapes, lambda decompositions: export_methods(vlm, shapes, decompositions=decompositions, quantize=quantize),
        constant_methods={**(metadata or {}), **runner_metadata(model, vlm, shapes)}, quantize=quantize,
        quantized_reference=quantized_reference, **partitioner_options,
    )
