"""One ``.pte`` with ``encoder`` and ``text_decoder``, each a Core AI delegate, both functions of one asset.

:func:`lower_speech` exports the two modules of :func:`~.whisper.adapt`
(their composites externalized: SDPA, ``layer_norm``), lowers both in one
``to_backend`` call with partitioners that ask for one shared asset
(``share_asset``: each weight stored once in the ``.pte``), and adds the
constant methods ExecuTorch's ASR runner and an app read
(:func:`runner_metadata`).  ``target="host"`` keeps the self-attention caches
as Core AI state of ``text_decoder``'s delegate; ``target="device"`` is the
form upstream's on-device runtime takes (:mod:`.device`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coreai_partitioner.speech_recognition.whisper import FRAMES, Speech, adapt

#: What a lowered speech model is for, as the LLM's targets: this package's host runtime, or upstream's device runtime.
TARGETS = ("host", "device")

#: The methods, in the order an app calls them.
METHODS = ("encoder", "text_decoder")


def samples(speech: Speech) -> dict[str, tuple[torch.Tensor, ...]]:
    """Each method's sample inputs: the shapes and dtypes the ASR runner passes."""
    dtype = speech.decoder.embed.weight.dtype
    return {
        "encoder": (torch.zeros(1, speech.n_mels, FRAMES),),
        "text_decoder": (
            torch.zeros(1, 1, dtype=torch.long),
            torch.zeros(speech.cross_shape, dtype=dtype),
            torch.zeros(1, dtype=torch.long),
        ),
    }


def runner_metadata(model: nn.Module, speech: Speech) -> dict[str, Any]:
    """The constant methods: what ExecuTorch's ASR runner reads (``get_eos_ids``) and what an app needs to feed it.

    ``decoder_start_token_id`` is the runner's ``Seq2SeqTranscribeConfig``
    start token; ``get_max_seq_len`` the self-attention cache length (the
    decode stops before it); ``get_n_mels`` and ``get_n_frames`` the
    encoder's input ``[1, n_mels, n_frames]``.
    """
    config = model.config
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None) or config.eos_token_id
    start = getattr(generation, "decoder_start_token_id", None) or config.decoder_start_token_id
    return {
        "get_eos_ids": [eos] if isinstance(eos, int) else list(eos),
        "decoder_start_token_id": int(start),
        "get_max_seq_len": speech.decoder.max_decode_len,
        "get_vocab_size": config.vocab_size,
        "get_n_mels": speech.n_mels,
        "get_n_frames": FRAMES,
        "use_kv_cache": True,
    }


def lower_speech(
    model: nn.Module,
    *,
    target: str = "host",
    max_decode_len: int | None = None,
    speech: Speech | None = None,
    phases: dict[str, float] | None = None,
    **partitioner_options: Any,
):
    """Export and lower a ``WhisperForConditionalGeneration`` to methods ``encoder`` and ``text_decoder``.

    ``max_decode_len`` is the self-attention cache length (default the
    model's ``max_target_positions``).  Returns the ``EdgeProgramManager``;
    its ``.to_executorch()`` is the ``.pte``.  ``phases``, when given,
    receives the seconds of each phase (``export encoder``, ``export
    text_decoder``, ``lower``).
    """
    from coreai_partitioner.lowering.methods import lower_method_modules
    from coreai_partitioner.speech_recognition.device import DeviceTextDecoder

    if target not in TARGETS:
        raise ValueError(f"target {target!r}: choose one of {', '.join(TARGETS)}")
    speech = speech if speech is not None else adapt(model, max_decode_len)
    device = target == "device"
    modules = {"encoder": speech.encoder, "text_decoder": DeviceTextDecoder(speech.decoder) if device else speech.decoder}
    return lower_method_modules(
        modules, samples(speech), device=device, constant_methods=runner_metadata(model, speech), phases=phases,
        **partitioner_options,
    )
