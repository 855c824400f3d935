"""The ``verify`` method: a speculative decoder's one target call for several tokens.

Contract (every text-generation ``.pte``, host and device forms, but the host
form's enumerated shapes; :attr:`~.shapes.DecoderShapes.verify_tokens`):

* ``verify(tokens [1, V] int64, input_pos [V] int64) -> logits [1, V, vocab]``,
  ``V`` static, read off the constant method ``get_verify_len``
  (``get_max_draft_len`` is ``V - 1``).  ``tokens`` are the last token the
  caches do not hold yet and up to ``V - 1`` drafts after it, at their own
  consecutive positions; row ``i`` of the logits predicts position
  ``input_pos[i] + 1``.  Fewer drafts are padded with any tokens: a pad is
  one more draft, accepted only where it is the greedy token.
* It reads and writes the caches ``forward`` reads and writes (one state:
  the host runtime gives the functions of one asset in one loaded program one
  Core AI state; the device form's caches are ExecuTorch's buffers, which the
  methods share), and writes every position's keys and values.
* **Rollback is by position**: the next call (``forward`` or ``verify``)
  starts at the first position not accepted.  What each kind of cache does so
  that no rejected draft reaches a later call:

  - a full KV cache: a call at ``p`` attends slots up to each of its own
    positions only, which it writes first; a rejected draft's slot is
    overwritten before it is ever attended;
  - a sliding window's ring keeps ``V - 1`` slots beyond its window
    (:attr:`~coreai_partitioner.blocks.Attention.ring`), so a verify call's
    writes overwrite no position a later call's window still needs, and a
    slot at or past a call's first position is never attended
    (:func:`~coreai_partitioner.blocks.cache.window_plan`);
  - a recurrent layer's state (gated delta, short convolution) is kept after
    every position of a verify call (its stash,
    :func:`~coreai_partitioner.blocks.recurrent.add_stashes`); the next call
    starts from the row of its first position (:meth:`~coreai_partitioner.blocks.Step.carry`).
    The cost: ``V`` states per recurrent layer in memory, and ``V`` delta
    updates of one token each in the verify call, no call more.

* ``forward`` and ExecuTorch's stock runners are unchanged by it: the runner
  calls ``forward``, and ``prefill``'s output stays the last position's logits.

:func:`verifying` is how the method is traced: the same decoder, so both
methods name and store their weights once in the shared asset.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from coreai_partitioner.text_decoder.decoder import Decoder


@contextlib.contextmanager
def verifying(decoder: Decoder) -> Iterator[Decoder]:
    """``decoder`` as its ``verify`` method while the context lasts: every position's logits, each recurrent
    layer's state kept after every position."""
    if not decoder.verify_len:
        raise ValueError(f"{decoder.model_type}: the decoder was built without a verify call (verify_len 0)")
    decoder.verifying = True
    try:
        yield decoder
    finally:
        decoder.verifying = False
