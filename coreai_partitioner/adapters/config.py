"""A PEFT LoRA adapter read and checked against its base: which linear layers, each one's rank, scale and weights.

:func:`check_adapter_config` reads ``adapter_config.json`` alone and refuses,
by field, everything plain LoRA (``W x + B A x · scale``, unmerged) does not
have; it runs before a base model is loaded.  :func:`read_adapter` then lets
PEFT itself resolve the config against the base model built on the meta
device (``target_modules``, ``layers_to_transform``, ``rank_pattern``,
``alpha_pattern``, ``use_rslora``: PEFT's own matching and scaling), checks
each targeted layer is an ``nn.Linear`` and each saved matrix has the shape
that layer needs, and reads the weights.  :func:`adapter_of_peft_model` reads
the active adapter of a ``PeftModel`` in memory the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

#: Config fields that change LoRA's forward or train more than the low-rank pair: ``(field, refused when, why)``.
_REFUSED_FIELDS: tuple[tuple[str, Any, str], ...] = (
    ("use_dora", bool, "DoRA rescales the base weight by a trained magnitude, so the base is no longer shared"),
    ("modules_to_save", bool, "modules_to_save trains full copies of those modules, a second base in all but name"),
    ("bias", lambda value: value not in (None, "none"), "a trained bias changes the base layer's own parameters"),
    ("lora_bias", bool, "lora_bias adds a trained bias to B"),
    ("trainable_token_indices", bool, "trainable tokens rewrite rows of the base embedding"),
    ("target_parameters", bool, "LoRA on parameters (MoE experts as 3-d tensors) is not a linear layer"),
    ("layer_replication", bool, "layer replication changes the base model's layer stack"),
    ("fan_in_fan_out", bool, "fan_in_fan_out targets Conv1D layers (GPT-2), which are not nn.Linear"),
    ("alora_invocation_tokens", bool, "activated LoRA switches on at runtime tokens"),
    ("use_qalora", bool, "QA-LoRA pools the input groupwise before A"),
)


class AdapterError(ValueError):
    """An adapter this export cannot take; the message names the adapter, the field or module, and the fix."""


@dataclass(frozen=True)
class LowRank:
    """One targeted linear layer of one adapter: ``y = W x + (x Aᵀ) Bᵀ · scale``."""

    rank: int
    scale: float
    a: torch.Tensor  # [rank, in_features]
    b: torch.Tensor  # [out_features, rank]

    def scaled(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``A`` and ``B · scale`` in ``dtype``: the pair a program computes ``(x Aᵀ) Bᵀ`` with."""
        return self.a.to(dtype), (self.b.to(torch.float32) * self.scale).to(dtype)


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter over a base model: its name and, by module path in the base model, each layer's pair."""

    name: str
    layers: Mapping[str, LowRank]
    source: str

    @property
    def nbytes(self) -> int:
        return sum(layer.a.nbytes + layer.b.nbytes for layer in self.layers.values())


def parse_adapter_argument(text: str) -> tuple[str, Path]:
    """``NAME=DIR`` or ``DIR`` (named after the directory): the name the adapter's ``.pte`` takes, and its directory."""
    name, separator, directory = text.partition("=")
    if not separator:
        name, directory = Path(text).name, text
    if not name or not name.replace("-", "_").replace(".", "_").isidentifier():
        raise AdapterError(
            f"--adapter {text!r}: the adapter's name {name!r} must be a file name of letters, digits, '-', '_' or '.'; "
            "give one as NAME=DIR"
        )
    return name, Path(directory)


def check_adapter_config(directory: str | Path) -> dict[str, Any]:
    """``adapter_config.json`` of ``directory``, refused by field unless it is plain LoRA over linear layers."""
    directory = Path(directory)
    path = directory / CONFIG_FILE
    if not path.is_file():
        found = "config.json (a whole model)" if (directory / "config.json").is_file() else "no adapter_config.json"
        raise AdapterError(f"{directory} is not a PEFT adapter directory: it has {found}; --adapter takes a directory "
                           f"PeftModel.save_pretrained wrote ({CONFIG_FILE}, {WEIGHTS_FILE})")
    config = json.loads(path.read_text())
    kind = config.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise AdapterError(f"{path}: peft_type {kind!r}; only LoRA adapters are exported (peft_type 'LORA')")
    for field, refused_when, why in _REFUSED_FIELDS:
        value = config.get(field)
        if value is not None and refused_when(value):
            raise AdapterError(
                f"{path}: {field}={value!r} is not supported: {why}. Train the adapter without {field}, or merge it "
                "into the base (PeftModel.merge_and_unload) and export that model as a whole"
            )
    if not (directory / WEIGHTS_FILE).is_file():
        raise AdapterError(f"{directory} has no {WEIGHTS_FILE}; save the adapter with safe_serialization=True")
    return config


def check_base_name(config: Mapping[str, Any], directory: Path, base_name: str | None) -> None:
    """Refuse an adapter trained on another base, by name: ``base_model_name_or_path``'s last part against the
    checkpoint's (``None``, unknown, is not refused; shapes are checked in any case)."""
    recorded = config.get("base_model_name_or_path")
    if not recorded or not base_name:
        return
    if _last_part(recorded) != _last_part(base_name):
        raise AdapterError(
            f"{directory}: the adapter was trained on {recorded!r} (base_model_name_or_path), not on {base_name!r}; "
            "export it over the checkpoint it was trained on (or, if this checkpoint is that model under another "
            "name, set base_model_name_or_path in its adapter_config.json)"
        )


def _last_part(name: str) -> str:
    return Path(str(name).rstrip("/")).name.lower()


def read_adapter(name: str, directory: str | Path, base_config: Any, *, base_name: str | None = None) -> Adapter:
    """The adapter in ``directory`` over a model of ``base_config`` (a transformers config), checked and read.

    PEFT resolves the config over the model built on the meta device, so
    each targeted layer, rank and scale is PEFT's own; each must be an
    ``nn.Linear`` and each saved matrix must have the shape it needs.
    """
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    config = check_adapter_config(directory)
    check_base_name(config, directory, base_name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(base_config)
    resolved = _resolve(model, config, directory)
    layers: dict[str, LowRank] = {}
    with safe_open(str(directory / WEIGHTS_FILE), framework="pt") as weights:
        keys = set(weights.keys())
        for path, (rank, scale, linear) in resolved.items():
            pair = []
            for matrix, shape in (("lora_A", (rank, linear.in_features)), ("lora_B", (linear.out_features, rank))):
                key = _saved_key(keys, path, matrix)
                if key is None:
                    raise AdapterError(f"{directory / WEIGHTS_FILE} has no {matrix} for {path}, which its config targets")
                found = tuple(weights.get_slice(key).get_shape())
                if found != shape:
                    raise AdapterError(
                        f"{directory}: {key} is {list(found)}, while {path} of the base needs {list(shape)}: the "
                        "adapter was trained on another base model; export it over the checkpoint it was trained on"
                    )
                pair.append(weights.get_tensor(key))
            layers[path] = LowRank(rank, scale, pair[0], pair[1])
    return Adapter(name, layers, str(directory))


def _resolve(model: nn.Module, config: Mapping[str, Any], directory: Path) -> dict[str, tuple[int, float, nn.Linear]]:
    """``{module path: (rank, scale, base linear)}`` as PEFT resolves ``config`` over ``model`` (meta)."""
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.lora import LoraLayer

    known = set(LoraConfig.__dataclass_fields__)
    lora_config = LoraConfig(**{key: value for key, value in config.items() if key in known})
    try:
        inject_adapter_in_model(lora_config, model, adapter_name="export")
    except ValueError as error:  # PEFT's own word: a target it finds nowhere, a module type it cannot wrap
        raise AdapterError(f"{directory}: {error}") from error
    resolved = {}
    for path, module in model.named_modules():
        if isinstance(module, LoraLayer) and "export" in module.r:
            base = module.get_base_layer()
            if type(base) is not nn.Linear:
                raise AdapterError(
                    f"{directory}: target module {path} is {type(base).__name__}, not nn.Linear; only linear layers "
                    "take an adapter here: drop it from target_modules"
                )
            resolved[path] = (int(module.r["export"]), float(module.scaling["export"]), base)
    if not resolved:
        raise AdapterError(f"{directory}: target_modules {config.get('target_modules')!r} match no layer of the base")
    return resolved


def _saved_key(keys: set[str], path: str, matrix: str) -> str | None:
    """The safetensors key PEFT saved ``path``'s ``matrix`` under (``base_model.model.<path>.lora_A.weight``)."""
    for key in (f"base_model.model.{path}.{matrix}.weight", f"{path}.{matrix}.weight"):
        if key in keys:
            return key
    return None


def adapter_of_peft_model(peft_model: nn.Module, name: str | None = None) -> Adapter:
    """The active adapter of a ``PeftModel`` (or ``name``), checked as :func:`check_adapter_config` checks a file."""
    from peft.tuners.lora import LoraLayer

    active = name or peft_model.active_adapter
    config = peft_model.peft_config[active].to_dict()
    for field, refused_when, why in _REFUSED_FIELDS:
        value = config.get(field)
        if value is not None and refused_when(value):
            raise AdapterError(f"PeftModel adapter {active!r}: {field}={value!r} is not supported: {why}")
    base = peft_model.get_base_model()
    layers = {}
    for path, module in base.named_modules():
        if isinstance(module, LoraLayer) and active in module.r:
            linear = module.get_base_layer()
            if type(linear) is not nn.Linear:
                raise AdapterError(f"PeftModel adapter {active!r}: {path} is {type(linear).__name__}, not nn.Linear")
            layers[path] = LowRank(
                int(module.r[active]), float(module.scaling[active]),
                module.lora_A[active].weight.detach(), module.lora_B[active].weight.detach(),
            )
    return Adapter(active, layers, f"PeftModel adapter {active!r}")
