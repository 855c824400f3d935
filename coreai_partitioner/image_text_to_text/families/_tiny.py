"""What every vision family's tiny config starts from: a 2-layer tower on 32x32 images, and a one-character tokenizer."""

from __future__ import annotations

from typing import Any

#: A tower of 2 layers, width 32, over 32x32 images in 8x8 patches (16 patches).
TOWER = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2, image_size=32, patch_size=8)

#: Where the tiny configs put their image placeholder and the tokens around it (inside the 256-token vocabulary).
IMAGE_TOKEN_ID = 250


def text_config(model_type: str, **overrides: Any) -> Any:
    """The text-decoder family's tiny text config for ``model_type``, cut to 2 layers."""
    from coreai_partitioner.text_decoder import first_layers, tiny_config

    config = tiny_config(model_type)
    if config.num_hidden_layers > 2:
        config = first_layers(config, 2)
    for name, value in overrides.items():
        setattr(config, name, value)
    return config


def characters() -> list[str]:
    """Token ``i`` of the tiny vocabulary: one printable character (ASCII and newline as themselves, the rest from U+0100)."""
    return [chr(i) if 32 <= i < 127 or i == 10 else chr(0x100 + i) for i in range(256)]


def tokenizer(config: Any, special: dict[int, str], **named: str) -> Any:
    """A ``PreTrainedTokenizerFast`` of one character per token, its ids ``special`` (id -> text) whole special tokens.

    ``named`` gives the tokenizer's named special tokens (``image_token="<image>"``),
    which the processors read.  ``tokenizer.backend_tokenizer.save(path)``
    writes the ``tokenizer.json`` ExecuTorch's runner loads.
    """
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    text = config.get_text_config()
    vocab = characters()
    for index, content in special.items():
        vocab[index] = content
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(vocab)}, merges=[], unk_token=vocab[0]))
    backend.decoder = decoders.Fuse()
    ends = {"bos_token": text.bos_token_id, "eos_token": text.eos_token_id, "pad_token": text.pad_token_id}
    backend.add_special_tokens([vocab[i] for i in ends.values() if isinstance(i, int)] + list(special.values()))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        **{name: vocab[i] for name, i in ends.items() if isinstance(i, int)},
        extra_special_tokens=named,
    )
