"""The limits a lowered decoder is built for (:class:`DecoderShapes`), and the constant methods that tell a runner them.

Every task with a text decoder (an LLM's ``forward``, a vision-language
model's ``text_decoder``) is exported for a cache length and a most-tokens-a-call;
:func:`runner_metadata` is what ExecuTorch's LLM runner reads of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

#: Shape modes of the host form's ``forward``: ``T`` any of 1..chunk, or only 1 and chunk.
SHAPE_MODES = ("dynamic", "enumerated")

#: What a lowered decoder is for: this package's host runtime (caches as delegate state, any shape mode), or
#: upstream's on-device Core AI runtime (:mod:`coreai_partitioner.text_decoder.device`: static shapes, caches owned by ExecuTorch).
TARGETS = ("host", "device")

#: The default tokens of a ``verify`` call: the last token and 8 drafts (ExecuTorch's static llama decodes with a
#: static input of 32; 9 keeps the host runtime's verify near a decode step's cost).
VERIFY_LEN = 9

#: How the device form lays out its shapes: one bounded-dynamic ``forward`` (T in 1..chunk), or two static
#: methods (``forward`` T = 1, ``prefill`` T = chunk).
DEVICE_SHAPES = ("bounded", "static")


@dataclass(frozen=True)
class DecoderShapes:
    """The limits a lowered decoder was built for.

    ``max_context_len`` is the cache length (prompt plus generated tokens);
    ``prefill_chunk`` the most tokens one ``forward`` call takes.  ``mode``
    ``"dynamic"`` exports ``T`` as a dimension from 1 to ``prefill_chunk``
    (GPU and CPU targets, and any prompt length in one call); ``"enumerated"``
    compiles one Core AI asset with an entrypoint for ``T = 1`` and one for
    ``T = prefill_chunk`` sharing the weights (static shapes; a shorter prompt
    is padded in front to the chunk).  Both are the host form's.

    ``target="device"`` is the form upstream's on-device runtime runs
    (:mod:`coreai_partitioner.text_decoder.device`), laid out by ``device_shapes``: ``"bounded"`` (default)
    is one method ``forward`` whose ``T`` runs from 1 to ``prefill_chunk``, a
    bounded-dynamic dimension (ExecuTorch's ``TextLLMRunner`` prefills a
    prompt in chunks of ``prefill_chunk``); ``"static"`` is a method ``forward``
    of ``T = 1`` and a method ``prefill`` of ``T = prefill_chunk``, for a
    runner that wants fixed shapes (a prompt in whole chunks, the rest one
    token a call).
    """

    max_context_len: int = 128
    prefill_chunk: int = 32
    mode: str = "dynamic"
    target: str = "host"
    device_shapes: str = "bounded"
    #: The tokens of one ``verify`` call (speculative decoding: the last token and up to ``verify_len - 1`` drafts);
    #: ``None``: :data:`VERIFY_LEN` or the context if shorter (what ``export`` asks for); ``0`` (default of the
    #: Python API): no ``verify`` method.
    verify_len: int | None = 0

    def __post_init__(self) -> None:
        if self.mode not in SHAPE_MODES:
            raise ValueError(f"shape mode {self.mode!r}: choose one of {', '.join(SHAPE_MODES)}")
        if self.target not in TARGETS:
            raise ValueError(f"target {self.target!r}: choose one of {', '.join(TARGETS)}")
        if self.device_shapes not in DEVICE_SHAPES:
            raise ValueError(f"device shapes {self.device_shapes!r}: choose one of {', '.join(DEVICE_SHAPES)}")
        if self.target == "device" and self.mode == "enumerated":
            raise ValueError(
                "the device form lays out its own shapes (device_shapes: bounded, forward T = 1..prefill_chunk; or "
                "static, forward T = 1 and prefill T = prefill_chunk); leave the shape mode at its default"
            )
        if not 1 <= self.prefill_chunk <= self.max_context_len:
            raise ValueError(
                f"prefill_chunk {self.prefill_chunk} must be between 1 and max_context_len "
                f"{self.max_context_len}"
            )
        if self.mode == "enumerated" and self.prefill_chunk == 1:
            raise ValueError("enumerated shapes need prefill_chunk > 1 (T = 1 and T = prefill_chunk)")
        if self.verify_len is not None and self.verify_len != 0 and not 2 <= self.verify_len <= self.max_context_len:
            raise ValueError(
                f"verify_len {self.verify_len}: a verify call takes the last token and at least one draft, within the "
                f"context; give 2 to max_context_len {self.max_context_len}, or 0 for no verify method"
            )
        if self.verify_len and self.mode == "enumerated":
            raise ValueError(
                "enumerated shapes give forward's asset a function per shape, which a verify method cannot share; "
                "export with --shapes dynamic (or the device form) for speculative decoding, or verify_len=0"
            )

    @property
    def verify_tokens(self) -> int:
        """The ``verify`` method's static ``T`` (0: none).  The enumerated host shapes have none: their asset's
        functions are ``forward``'s shapes, and a second method cannot share it."""
        if self.verify_len is None:
            tokens = 0 if self.mode == "enumerated" else min(VERIFY_LEN, self.max_context_len)
            return tokens if tokens >= 2 else 0
        return self.verify_len

    @property
    def device(self) -> bool:
        return self.target == "device"

    @property
    def bounded(self) -> bool:
        """Whether the device form's ``forward`` takes any ``T`` up to the chunk (else ``T = 1``, beside ``prefill``)."""
        return self.device and self.device_shapes == "bounded"

    def methods(self) -> dict[str, int | None]:
        """The methods of the ``.pte`` and their static ``T`` (``None``: ``T`` from 1 to the chunk).

        The host form and the device form's bounded layout: ``forward``.  The device form's static layout:
        ``forward`` 1 and ``prefill`` the chunk (when above 1).  Then ``verify`` of :attr:`verify_tokens`, every
        position's logits over the same caches (:mod:`coreai_partitioner.text_decoder.verify`).
        """
        if not self.device or self.device_shapes == "bounded":
            methods: dict[str, int | None] = {"forward": None}
        else:
            methods = {"forward": 1}
            if self.prefill_chunk > 1:
                methods["prefill"] = self.prefill_chunk
        if self.verify_tokens:
            methods["verify"] = self.verify_tokens
        return methods

    def input_enumerations(self) -> list[dict[int, list[int]]] | None:
        """``CoreAIPartitioner(input_enumerations=...)`` for this mode: T of tokens and input_pos."""
        if self.mode != "enumerated":
            return None
        values = [1, self.prefill_chunk]
        return [{1: values}, {0: values}]


class UnsupportedShapes(ValueError):
    """Shapes a model cannot be exported with; names the model type, the reason and the shapes it takes."""


def runner_metadata(model: nn.Module, shapes: DecoderShapes) -> dict[str, Any]:
    """The constant methods ExecuTorch's LLM runner reads (``extension/llm/runner/constants.h``).

    ``get_max_seq_len`` (required by the runner) is the most tokens one call
    takes, ``get_max_context_len`` the cache length.  ``enable_dynamic_shape``
    makes the runner prefill a prompt in calls of up to ``get_max_seq_len``
    tokens; without it (enumerated shapes, the device form's static layout)
    it feeds the prompt one token at a time (T = 1 is always there).
    ``get_verify_len`` (where there is a ``verify`` method) is its ``T``, and
    ``get_max_draft_len`` one less: the most drafts a call verifies.
    """
    config = model.config.get_text_config()
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None) or getattr(config, "eos_token_id", None)
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    bos = getattr(generation, "bos_token_id", None) or getattr(config, "bos_token_id", None)
    return {
        "get_max_seq_len": shapes.prefill_chunk,
        "get_max_context_len": shapes.max_context_len,
        "get_vocab_size": config.vocab_size,
        "get_bos_id": bos if bos is not None else 0,
        "get_eos_ids": eos_ids,
        "use_kv_cache": True,
        "enable_dynamic_shape": shapes.bounded if shapes.device else shapes.mode == "dynamic",
        **({"get_verify_len": shapes.verify_tokens, "get_max_draft_len": shapes.verify_tokens - 1} if shapes.verify_tokens else {}),
    }
