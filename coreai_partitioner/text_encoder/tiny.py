"""Tiny random BERT, RoBERTa and DistilBERT (2 layers, width 32) and a one-character-per-token WordPiece tokenizer.

Each model type is a tiny model of both tasks, under its own name: ``bert``
is a ``BertForMaskedLM`` (``fill-mask``), ``sentence-bert`` a ``BertModel``
pooled as all-MiniLM-L6-v2 is (``feature-extraction``: the tokens' mean at
unit length, :data:`SENTENCE`).  The vocabulary is the type's special tokens,
then each printable ASCII character alone and as a word's continuation
(``##a``), so any English text tokenizes, a character a token.  Weights are
drawn at 10 times Hugging Face's scale, so every one of them moves the
outputs.
"""

from __future__ import annotations

from typing import Any

from coreai_partitioner.text_encoder.pooling import SentenceConfig

MODEL_TYPES = ("bert", "roberta", "distilbert")

#: The ``--config`` names of each task's tiny models, and the model type each is.
NAMES = {
    "fill-mask": {model_type: model_type for model_type in MODEL_TYPES},
    "feature-extraction": {f"sentence-{model_type}": model_type for model_type in MODEL_TYPES},
}

#: The special tokens of each model type, by role, in id order (RoBERTa pads with id 1, as its checkpoints do).
SPECIAL = {
    "bert": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    "roberta": {"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>"},
    "distilbert": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
}

#: The tokens the tiny models number (RoBERTa's table is longer: it numbers from the padding id + 1).
POSITIONS = 64

#: The pooling of the ``sentence-*`` models: all-MiniLM-L6-v2's.
SENTENCE = SentenceConfig(modes=("mean",), normalize=True)


def model_type_of(name: str) -> str:
    """The model type of the tiny model ``name`` (a ``--config`` name of :data:`NAMES`)."""
    for names in NAMES.values():
        if name in names:
            return names[name]
    known = ", ".join(n for names in NAMES.values() for n in names)
    raise ValueError(f"no tiny text encoder named {name!r}; the names are {known}")


def vocabulary(model_type: str) -> list[str]:
    """The tokens, in id order: the special tokens, the printable characters, then each as a continuation."""
    characters = [chr(i) for i in range(33, 127)]
    return [*SPECIAL[model_type].values(), *characters, *("##" + c for c in characters)]


def tiny_config(name: str) -> Any:
    """The config of the tiny model ``name``: ``architectures`` says its head (``...ForMaskedLM``, or the bare
    model of a ``sentence-*`` one)."""
    import transformers

    model_type = model_type_of(name)
    masked_lm = name in NAMES["fill-mask"]
    vocab = len(vocabulary(model_type))
    pad = list(SPECIAL[model_type]).index("pad")
    if model_type == "distilbert":
        config = transformers.DistilBertConfig(
            vocab_size=vocab, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=POSITIONS, pad_token_id=pad,
            initializer_range=0.2,
        )
    else:
        auto = transformers.BertConfig if model_type == "bert" else transformers.RobertaConfig
        positions = POSITIONS if model_type == "bert" else POSITIONS + pad + 1
        config = auto(
            vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=positions, pad_token_id=pad, initializer_range=0.2,
        )
    prefix = {"bert": "Bert", "roberta": "Roberta", "distilbert": "DistilBert"}[model_type]
    config.architectures = [prefix + ("ForMaskedLM" if masked_lm else "Model")]
    return config


def tiny_tokenizer(name: str) -> Any:
    """A ``PreTrainedTokenizerFast`` of :func:`vocabulary` for the tiny model ``name``: WordPiece over BERT's
    pre-tokenizer, its special tokens around a text as the model type has them; it makes the ``.pte``'s two inputs,
    ``input_ids`` and ``attention_mask``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    special = SPECIAL[model_type_of(name)]
    ids = {token: i for i, token in enumerate(vocabulary(model_type_of(name)))}
    cls, sep = special["cls"], special["sep"]
    tokenizer = Tokenizer(models.WordPiece(ids, unk_token=special["unk"]))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B {sep}", special_tokens=[(cls, ids[cls]), (sep, ids[sep])]
    )
    tokenizer.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_input_names=["input_ids", "attention_mask"], model_max_length=POSITIONS,
        **{f"{role}_token": token for role, token in special.items()},
    )
