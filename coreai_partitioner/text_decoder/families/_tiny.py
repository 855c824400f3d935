"""The sizes every family's tiny config starts from: a 256-token vocabulary, width 64, GQA, ids 0/1/2."""

from __future__ import annotations

from typing import Any

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def tiny(config_class: str, **overrides: Any) -> Any:
    """``transformers.<config_class>(**TINY, **overrides)``; an override of ``None`` drops the field."""
    import transformers

    sizes = {**TINY, **overrides}
    return getattr(transformers, config_class)(**{k: v for k, v in sizes.items() if v is not None})
