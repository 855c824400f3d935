"""A tiny random Whisper (2 layers each side, width 64) with a one-character-per-token tokenizer.

Its vocabulary is 256 characters (as :func:`coreai_partitioner.text_generation.byte_tokenizer`'s)
and Whisper's special tokens after them, and its generation config holds what
``generate`` reads to transcribe English without timestamps, so the same
loop, rules and checks run on it as on a real checkpoint.  The encoder still
takes a 30 s window (3,000 mel frames): that is the ASR runner's contract.
"""

from __future__ import annotations

from typing import Any

#: Whisper's special tokens, by id after the 256 characters.
SPECIAL = ("<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>", "<|notimestamps|>")
_ID = {token: 256 + i for i, token in enumerate(SPECIAL)}

#: The ``--config`` name.
NAME = "whisper"


def tiny_config() -> Any:
    """A ``WhisperConfig`` of two encoder and two decoder layers, width 64, a 64-slot decoder."""
    from transformers import WhisperConfig

    return WhisperConfig(
        vocab_size=256 + len(SPECIAL),
        num_mel_bins=80,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=1500,
        max_target_positions=64,
        decoder_start_token_id=_ID["<|startoftranscript|>"],
        bos_token_id=_ID["<|endoftext|>"],
        eos_token_id=_ID["<|endoftext|>"],
        pad_token_id=_ID["<|endoftext|>"],
        suppress_tokens=[],
        begin_suppress_tokens=[ord(" "), _ID["<|endoftext|>"]],
        architectures=["WhisperForConditionalGeneration"],
        init_std=0.2,  # HF's 0.02 makes a random model repeat one token; this one's greedy tokens vary
    )


def tiny_generation_config(config: Any) -> Any:
    """What ``generate(language="en", task="transcribe")`` reads, for :func:`tiny_config`'s vocabulary."""
    from transformers import GenerationConfig

    return GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        max_length=config.max_target_positions,
        suppress_tokens=list(config.suppress_tokens),
        begin_suppress_tokens=list(config.begin_suppress_tokens),
        is_multilingual=True,
        lang_to_id={"<|en|>": _ID["<|en|>"]},
        task_to_id={"transcribe": _ID["<|transcribe|>"], "translate": _ID["<|translate|>"]},
        no_timestamps_token_id=_ID["<|notimestamps|>"],
        return_timestamps=False,
    )


def tiny_model(seed: int = 0) -> Any:
    """:func:`tiny_config`'s ``WhisperForConditionalGeneration``, seeded, eager attention, its generation config set."""
    import torch
    from transformers import AutoModelForSpeechSeq2Seq

    torch.manual_seed(seed)
    config = tiny_config()
    model = AutoModelForSpeechSeq2Seq.from_config(config, attn_implementation="eager").eval()
    model.generation_config = tiny_generation_config(config)
    return model


def tiny_tokenizer() -> Any:
    """A ``tokenizers.Tokenizer``: token ``i < 256`` one printable character, then :data:`SPECIAL`."""
    from tokenizers import Tokenizer, decoders, models

    characters = [chr(i) if 32 <= i < 127 else chr(0x100 + i) for i in range(256)]
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(characters)}, merges=[], unk_token=characters[0]))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIAL))
    return tokenizer
