"""Tiny random T5s (2 layers each side, width 64) and a one-character-per-token tokenizer in T5's special-token ids.

``t5`` is the original T5's shape (relu MLP, LM head tied to the embedding,
rescaled by ``d_model ** -0.5``), ``flan-t5`` T5 v1.1's and Flan-T5's (gated
gelu, an LM head of its own).  Their weights are Hugging Face's init with
the MLPs scaled up (:func:`random_model`): as initialized, a random T5
repeats one token, and a larger ``initializer_factor`` grows the attention
scores, which T5 does not scale, until they amplify fp32's rounding past the
runtime's tolerance (scores near 100 at a factor of 2, against 5 here).  Their relative position bias has 8 buckets up
to distance 16, so a short input already reaches the logarithmic ones.  The
vocabulary is T5's ``<pad>`` (0, the decoder's start token), ``</s>`` (1)
and ``<unk>`` (2), then 256 characters; the tokenizer ends an input with
``</s>``, as T5's does.
"""

from __future__ import annotations

from typing import Any

#: T5's special tokens, by id, before the 256 characters.
SPECIAL = ("<pad>", "</s>", "<unk>")

#: The ``--config`` names and the feed-forward each has.
FEED_FORWARD = {"t5": "relu", "flan-t5": "gated-gelu"}


def tiny_config(name: str = "t5") -> Any:
    """A ``T5Config`` of two encoder and two decoder layers, width 64, 4 heads of 16, 64 positions."""
    from transformers import T5Config

    if name not in FEED_FORWARD:
        raise ValueError(f"no tiny text2text config {name!r}; choose one of {', '.join(FEED_FORWARD)}")
    return T5Config(
        vocab_size=len(SPECIAL) + 256,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        feed_forward_proj=FEED_FORWARD[name],
        tie_word_embeddings=name == "t5",
        n_positions=64,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        architectures=["T5ForConditionalGeneration"],
    )


def tiny_generation_config(config: Any) -> Any:
    """Greedy decoding as ``generate`` does it for T5: from ``<pad>`` to ``</s>``."""
    from transformers import GenerationConfig

    return GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        max_length=config.n_positions,
    )


#: What :func:`random_model` scales the MLPs' weights by.
MLP_SCALE = 3.0


def random_model(config: Any) -> Any:
    """A ``T5ForConditionalGeneration`` of ``config`` from torch's random state: Hugging Face's init, eager attention,
    the MLPs' weights scaled by :data:`MLP_SCALE` (its greedy tokens vary; its attention scores stay small)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if ".DenseReluDense." in name:
                weight.mul_(MLP_SCALE)
    return model


def tiny_model(name: str = "t5", seed: int = 0) -> Any:
    """:func:`tiny_config`'s :func:`random_model`, seeded, its generation config set: what ``--config NAME`` exports."""
    import torch

    torch.manual_seed(seed)
    config = tiny_config(name)
    model = random_model(config)
    model.generation_config = tiny_generation_config(config)
    return model


def tiny_tokenizer() -> Any:
    """A ``tokenizers.Tokenizer``: :data:`SPECIAL`, then token ``3 + i`` one printable character; ``</s>`` appended."""
    from tokenizers import Tokenizer, decoders, models, processors

    characters = [chr(i) if 32 <= i < 127 else chr(0x100 + i) for i in range(256)]
    vocab = {token: i for i, token in enumerate(SPECIAL)} | {c: len(SPECIAL) + i for i, c in enumerate(characters)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIAL))
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return tokenizer
