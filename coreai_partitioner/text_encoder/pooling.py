"""The sentence embedding a sentence-transformers checkpoint computes from its encoder's states, read off its files.

A sentence-transformers checkpoint lists its modules in ``modules.json``: the
``Transformer`` (the Hugging Face encoder), a ``Pooling`` whose
``config.json`` names the pooling modes (``pooling_mode: "mean"``, or the
older ``pooling_mode_mean_tokens: true`` and its siblings), and optionally
``Normalize`` (unit L2 length).  :func:`read_sentence_config` reads them and
refuses, before any work, a module or a mode :class:`Pooling` does not
compute; ``sentence_bert_config.json``'s ``max_seq_length`` is the longest
input the checkpoint's own pipeline feeds the encoder.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch import nn

from coreai_partitioner.text_encoder.errors import UnsupportedSentenceModel

#: The pooling modes :class:`Pooling` computes, and what each is.
MODES = {
    "cls": "the first token's state (the tokenizers here pad on the right)",
    "max": "each channel's largest over the tokens",
    "mean": "the tokens' mean",
    "mean_sqrt_len_tokens": "the tokens' sum over the square root of their number",
}
#: sentence-transformers' older config keys, one per mode, in the order it concatenates them.
LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
#: The modules of ``modules.json`` this path computes (the last part of their ``type``).
MODULES = ("Transformer", "Pooling", "Normalize")


@dataclasses.dataclass(frozen=True)
class SentenceConfig:
    """What a sentence-transformers checkpoint computes after its encoder: the pooling ``modes`` (concatenated in
    this order), ``normalize`` (unit L2 length), and ``max_seq_length`` (``None``: the checkpoint does not say)."""

    modes: tuple[str, ...] = ("mean",)
    normalize: bool = False
    max_seq_length: int | None = None

    def __post_init__(self) -> None:
        refused = [mode for mode in self.modes if mode not in MODES]
        if refused or not self.modes:
            raise UnsupportedSentenceModel(
                f"pooling mode {', '.join(map(repr, refused)) or '(none)'} is not computed here; the pooling modes are "
                f"{', '.join(MODES)}: export the encoder's states (feature-extraction without pooling is not offered) "
                "or choose a checkpoint pooled by one of these"
            )


def read_sentence_config(directory: str | Path) -> SentenceConfig:
    """The :class:`SentenceConfig` of the sentence-transformers checkpoint in ``directory`` (``modules.json``,
    its ``Pooling`` module's ``config.json``, ``sentence_bert_config.json``)."""
    directory = Path(directory)
    listed = directory / "modules.json"
    if not listed.is_file():
        raise UnsupportedSentenceModel(
            f"{directory} has no modules.json: it is not a sentence-transformers checkpoint, which feature-extraction "
            "reads its pooling from; pass sentence=SentenceConfig(modes=(...)) to say it yourself"
        )
    modules = json.loads(listed.read_text())
    kinds = [module["type"].rsplit(".", 1)[-1] for module in modules]
    refused = [module["type"] for module, kind in zip(modules, kinds) if kind not in MODULES]
    if refused:
        raise UnsupportedSentenceModel(
            f"{listed} lists {', '.join(refused)}, which this path does not compute (it computes "
            f"{', '.join(MODULES)}); export the encoder with fill-mask, or the model whole with coreai_partitioner.lower"
        )
    if kinds.count("Pooling") != 1:
        raise UnsupportedSentenceModel(f"{listed} lists {kinds.count('Pooling')} Pooling modules; feature-extraction takes one")
    pooling = modules[kinds.index("Pooling")]
    config = json.loads((directory / pooling["path"] / "config.json").read_text())
    bert_config = directory / "sentence_bert_config.json"
    max_seq_length = json.loads(bert_config.read_text()).get("max_seq_length") if bert_config.is_file() else None
    return SentenceConfig(modes=pooling_modes(config), normalize="Normalize" in kinds, max_seq_length=max_seq_length)


#: sentence-transformers' own files beside the modules' (the list of modules, the Transformer module's settings,
#: the library's version and prompts).
SENTENCE_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def sentence_files(directory: str | Path) -> list[Path]:
    """The files of the sentence-transformers checkpoint in ``directory`` that say its pooling, relative to it: those
    of :data:`SENTENCE_FILES` it holds and each listed module's ``config.json`` (``1_Pooling/config.json``)."""
    directory = Path(directory)
    listed = directory / "modules.json"
    modules = json.loads(listed.read_text()) if listed.is_file() else []
    paths = [Path(name) for name in SENTENCE_FILES] + [Path(m["path"]) / "config.json" for m in modules if m.get("path")]
    return [path for path in paths if (directory / path).is_file()]


def pooling_modes(config: dict) -> tuple[str, ...]:
    """The modes a ``Pooling`` ``config.json`` names: ``pooling_mode`` (a name or a list), else the older
    ``pooling_mode_*`` flags in sentence-transformers' order (none set: ``mean``, as it defaults)."""
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        return (mode,) if isinstance(mode, str) else tuple(mode)
    return tuple(mode for key, mode in LEGACY_KEYS.items() if config.get(key)) or ("mean",)


class Pooling(nn.Module):
    """``(states [B, T, width], attention_mask [B, T]) -> [B, width * modes]``: each mode over the tokens the
    mask marks, concatenated; unit length when ``normalize``."""

    def __init__(self, config: SentenceConfig) -> None:
        super().__init__()
        self.modes, self.normalize = config.modes, config.normalize

    def forward(self, states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = (attention_mask != 0).unsqueeze(-1)
        pooled = []
        for mode in self.modes:
            if mode == "cls":
                pooled.append(states[:, 0])
            elif mode == "max":
                pooled.append(states.masked_fill(~mask, torch.finfo(states.dtype).min).amax(dim=1))
            else:
                total = (states * mask.to(states.dtype)).sum(dim=1)
                count = mask.to(states.dtype).sum(dim=1).clamp(min=1e-9)
                pooled.append(total / (count if mode == "mean" else count.sqrt()))
        embedding = pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=-1)
        return nn.functional.normalize(embedding, p=2.0, dim=-1) if self.normalize else embedding
