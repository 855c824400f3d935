"""Tokenizer files of each kind ExecuTorch's runner reads, made here (nothing is downloaded), and checkpoints with them."""

from __future__ import annotations

import base64
from pathlib import Path

import torch

CORPUS = ["hello world, this is a tiny corpus for a tokenizer", "the quick brown fox jumps over the lazy dog"] * 40


def byte_level_bpe(path: Path, byte_order: list[int] | None = None) -> dict:
    """A GPT-2-style byte-level BPE ``tokenizer.json``: token ``i`` is byte ``byte_order[i]``, then two merges.

    Returns ``{"vocab": size, "bos": id, "eos": id, "bytes": {id: bytes}}``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()  # the 256 characters GPT-2 maps bytes to, in byte order
    as_char = {b: c for b, c in zip(_gpt2_byte_order(), _gpt2_chars())}
    assert sorted(alphabet) == sorted(as_char.values())
    order = byte_order if byte_order is not None else list(range(256))
    vocab = {as_char[b]: i for i, b in enumerate(order)}
    pieces = {i: bytes([b]) for i, b in enumerate(order)}
    merges = [(as_char[ord("h")], as_char[ord("e")]), (as_char[ord("l")], as_char[ord("l")])]
    for left, right in merges:
        vocab[left + right] = len(vocab)
        pieces[vocab[left + right]] = _gpt2_bytes(left + right)
    specials = ["<s>", "</s>"]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(path))
    ids = {s: tokenizer.token_to_id(s) for s in specials}
    return {"vocab": tokenizer.get_vocab_size(), "bos": ids["<s>"], "eos": ids["</s>"], "bytes": pieces}


def _gpt2_byte_order() -> list[int]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    return bs + [b for b in range(256) if b not in bs]


def _gpt2_chars() -> list[str]:
    bs = _gpt2_byte_order()
    printable = len(list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1)))
    return [chr(b) for b in bs[:printable]] + [chr(256 + n) for n in range(len(bs) - printable)]


def _gpt2_bytes(text: str) -> bytes:
    to_byte = {c: b for b, c in zip(_gpt2_byte_order(), _gpt2_chars())}
    return bytes(to_byte[c] for c in text)


def sentencepiece(path: Path) -> dict:
    """A SentencePiece BPE ``tokenizer.model`` trained on :data:`CORPUS`."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=60, model_type="bpe", minloglevel=2
    )
    path.write_bytes(model.getvalue())
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    return {"vocab": processor.vocab_size(), "bos": processor.bos_id(), "eos": processor.eos_id()}


#: pytorch_tokenizers' Tiktoken appends Llama 3's 256 special tokens (``<|begin_of_text|>`` first) to the ranks.
TIKTOKEN_SPECIALS = 256


def tiktoken(path: Path) -> dict:
    """A tiktoken ``tokenizer.model``: the 256 bytes and four merges, base64 and rank per line."""
    ranks = [bytes([i]) for i in range(256)] + [b"he", b"ll", b"lo", b"hello"]
    path.write_text("".join(f"{base64.b64encode(token).decode()} {rank}\n" for rank, token in enumerate(ranks)))
    return {"vocab": len(ranks) + TIKTOKEN_SPECIALS, "bos": len(ranks), "eos": len(ranks) + 1, "bytes": dict(enumerate(ranks))}


MAKERS = {"tokenizer.json": byte_level_bpe, "sentencepiece": sentencepiece, "tiktoken": tiktoken}
FILE_NAMES = {"tokenizer.json": "tokenizer.json", "sentencepiece": "tokenizer.model", "tiktoken": "tokenizer.model"}


def checkpoint(directory: Path, kind: str | None, **tokenizer_options) -> tuple[Path, dict]:
    """A tiny Llama checkpoint saved with ``save_pretrained`` and a tokenizer of ``kind`` (``None``: none)."""
    import transformers

    from coreai_partitioner import text_generation

    directory.mkdir(parents=True, exist_ok=True)
    info = MAKERS[kind](directory / FILE_NAMES[kind], **tokenizer_options) if kind else {"vocab": 256, "bos": 1, "eos": 2}
    config = text_generation.tiny_config("llama")
    config.vocab_size, config.bos_token_id, config.eos_token_id, config.pad_token_id = info["vocab"], info["bos"], info["eos"], None
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory, info
