"""The decoder step ExecuTorch's LLM runner calls: ``forward(tokens [1, T], input_pos [T]) -> logits``.

A :class:`Decoder` is built by a family's adapter (:mod:`.families`) over the
Hugging Face model's own modules: its embedding, its layers re-composed from
:mod:`.blocks`, its final norm and lm_head.  Every cache is a buffer of the
decoder's modules, updated in place: lowered with
``take_over_mutable_buffer=True`` (the default) they are the Core AI
delegate's state, carried from call to call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from coreai_partitioner.blocks import Attention, RopeTable, Step
from coreai_partitioner.blocks.recurrent import Recurrent, add_stashes


class Decoder(nn.Module):
    """``forward(tokens [1, T], input_pos [T]) -> logits``, the last position's ``[1, 1, vocab]`` by default.

    ``input_pos`` holds the cache positions of the ``T`` tokens (ExecuTorch's
    ``TextDecoderRunner`` feeds this form when the method's second input has
    more than one element).  ``T`` tokens at once is a prefill, one token a
    decode step; both write the caches.  With ``full_logits`` every
    position's logits come back, ``[1, T, vocab]``.

    ``embed_scale`` multiplies the embedding (Gemma's ``sqrt(hidden)``,
    Granite's ``embedding_multiplier``), ``logits_scale`` divides the logits
    (Granite's ``logits_scaling``), ``final_softcap`` soft-caps them (Gemma 2).
    ``prepare`` (optional) runs on ``(tokens, hidden, step)`` before the first
    layer, for inputs every layer reads (Gemma 4's per-layer inputs).
    """

    def __init__(
        self,
        *,
        model_type: str,
        embed: nn.Module,
        layers: Sequence[nn.Module],
        norm: nn.Module,
        lm_head: nn.Module,
        rope_tables: dict[str, RopeTable],
        context: int,
        embed_scale: float | None = None,
        logits_scale: float | None = None,
        final_softcap: float | None = None,
        prepare: nn.Module | None = None,
        full_logits: bool = False,
        plain: Sequence[tuple[str, str]] = (),
        verify_len: int = 0,
    ) -> None:
        super().__init__()
        self.model_type = model_type
        self.embed = embed
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.lm_head = lm_head
        self.rope_tables = nn.ModuleDict(rope_tables)
        self.context = context
        self.embed_scale = embed_scale
        self.logits_scale = logits_scale
        self.final_softcap = final_softcap
        self.prepare = prepare
        self.full_logits = full_logits
        #: The tokens of a verify call (0: the decoder has none); ``verifying`` is set while its ``verify`` method
        #: is traced (:func:`~.verify.verifying`): every position's logits come back, and each recurrent layer
        #: keeps its state after every position.
        self.verify_len = verify_len
        self.verifying = False
        #: ``(module path, reason)`` of what stays plain ops instead of a composite.
        self.plain = list(plain) + [
            (getattr(m, "path", name), m.plain_reason) for name, m in self.named_modules() if getattr(m, "plain_reason", None)
        ]
        rings = {m.window: m.ring for m in self.modules() if isinstance(m, Attention) and m.window is not None}
        for size in sorted(rings):
            self.register_buffer(f"window_positions_{size}", torch.zeros(rings[size]), persistent=False)
        if verify_len and any(isinstance(m, Recurrent) for m in self.modules()):
            add_stashes(self, verify_len)

    def window_positions(self, size: int) -> torch.Tensor:
        """The positions (plus one; 0 when empty) held by each slot of the rings of the sliding windows of ``size``
        positions (a ring keeps its window and a verify call's drafts more)."""
        return getattr(self, f"window_positions_{size}")

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype if getattr(self.norm, "weight", None) is not None else self.lm_head.weight.dtype

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return self.run(tokens, Step(self, input_pos, verifying=self.verifying))

    def run(self, tokens: torch.Tensor, step: Step) -> torch.Tensor:
        """The logits of ``tokens`` [1, T] at ``step``'s positions, its caches read and written the step's way."""
        return self.run_embedded(self.embedding(tokens), step, tokens)

    def embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        """The first layer's input for ``tokens`` [1, T]: the embedding, scaled where the family scales it."""
        hidden = self.embed(tokens)
        if self.embed_scale is not None:
            hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
        return hidden

    def run_embedded(self, hidden: torch.Tensor, step: Step, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """The logits of the embeddings ``hidden`` [1, T, D] (a vision-language model's text and image
        features); ``tokens`` are what ``prepare`` reads, where the family has one."""
        step.dtype = hidden.dtype
        if self.prepare is not None:
            self.prepare(tokens, hidden, step)
        for index, layer in enumerate(self.layers):
            hidden = step.before_layer(index, hidden)
            with step.scope(index):
                hidden = layer(hidden, step)
        step.finish()
        if not (self.full_logits or step.verifying):
            hidden = hidden[:, -1:, :]
        logits = self.lm_head(self.norm(hidden))
        if self.logits_scale is not None:
            logits = logits / self.logits_scale
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits


def state_buffers(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The buffers of a :class:`Decoder` (or of a module exported from one) that are its state, by name.

    Caches are named ``*_cache`` (keys, values), ``*_state`` (recurrent and
    convolution states) and ``window_positions_*`` (what a sliding window's
    slots hold); every one starts at zero.
    """
    found = []
    for name, buffer in module.named_buffers():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.startswith("window_positions_") or leaf.endswith("_cache") or leaf.endswith("_state"):
            found.append((name, buffer))
    return found


def reset_state(module: nn.Module) -> nn.Module:
    """Empty every cache of a :class:`Decoder`, or of a module exported from one (``program.module()``).

    Every cache starts at zero (an empty sliding window too, :func:`state_buffers`):
    the eager reference of a quantized export then starts from the state the
    ``.pte`` starts from.
    """
    for _, buffer in state_buffers(module):
        buffer.zero_()
    return module
