"""Builds named by a short line each, run one after another in one process, each file they write hashed.

    python -m same_bytes OUT "text-generation qwen3_next host" "torchvision vit_b_16 32" ...

Prints one JSON line per build (``{"build": ..., "files": {name: sha256}, "seconds": ...}``) after
:data:`MARK`.  ``tests/test_same_bytes.py`` runs it in two fresh processes and compares.  A build is one of:

* ``text-generation FAMILY FORM``: ``export --config FAMILY`` in FORM: ``host``, ``device``, ``int4`` (host),
  ``external-data`` (host, a ``.ptd`` beside the ``.pte``), ``graph-breaks`` (device, a delegate per layer),
  ``adapter`` (host, with a random LoRA adapter saved as PEFT saves one: the base ``.pte``, the ``.ptd``
  and the adapter's ``.pte``);
* ``TASK CONFIG``: ``export --task TASK --config CONFIG``;
* ``torchvision NAME SIZE``: :func:`coreai_partitioner.lower` of a torchvision model (random weights), as the
  backend suite builds it (:mod:`backend_suite.models`); torchvision's folder goes on the path before the first,
  so these run after every other build;
* ``lower bert``: :func:`coreai_partitioner.lower` of a tiny random BERT.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

MARK = "same-bytes:"

#: ``export`` options of each text-generation form.
FORMS = {
    "host": [],
    "device": ["--target", "device", "--prefill-chunk", "4"],  # a chunk no tiny config's sliding window is shorter than
    "int4": ["--quantize", "int4"],
    "external-data": ["--external-data"],
    "graph-breaks": ["--target", "device", "--prefill-chunk", "4", "--graph-breaks", "1"],
    "adapter": [],
}


def export(argv: list[str]) -> None:
    from coreai_partitioner.cli.export import main

    with contextlib.redirect_stdout(sys.stderr):
        code = main(argv)
    if code:
        raise SystemExit(f"export {' '.join(argv)} exited {code}")


def text_generation(family: str, form: str, out: Path) -> None:
    argv = ["--config", family, "--no-tokenizer", *FORMS[form], "--out", str(out / "model.pte")]
    if form == "adapter":
        argv = [*argv[2:], "--checkpoint", str(saved_base(family, out / "base")), "--adapter", f"tone={saved_adapter(out / 'base', out / 'tone')}"]
    export(argv)


def saved_base(family: str, directory: Path) -> Path:
    """The family's tiny config with seeded random weights, saved as a checkpoint."""
    from transformers import AutoModelForCausalLM

    from coreai_partitioner import text_generation

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(text_generation.tiny_config(family)).save_pretrained(directory)
    return directory


def saved_adapter(base: Path, directory: Path) -> Path:
    """A LoRA adapter over ``base`` with seeded random A and B, saved by PEFT."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0),
    )
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    model.save_pretrained(directory)
    return directory


def lowered(model: torch.nn.Module, sample: tuple, out: Path) -> None:
    from coreai_partitioner import lower, save_pte

    save_pte(lower(model.eval(), sample), out / "model.pte")


def torchvision_model(name: str, size: int) -> tuple[torch.nn.Module, tuple]:
    from backend_suite import TORCHVISION

    if str(TORCHVISION) not in sys.path:
        sys.path.append(str(TORCHVISION))
    import backend_suite.torchvision_ops  # noqa: F401  (torchvision's operator schemas, before torchvision)
    import torchvision

    torch.manual_seed(0)
    if name.startswith("vit_"):
        model = getattr(torchvision.models, name)(image_size=size)
        torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    else:
        model = getattr(torchvision.models, name)()
    return model, (torch.randn(1, 3, size, size),)


def tiny_bert() -> tuple[torch.nn.Module, tuple]:
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    return transformers.BertModel(config), (torch.randint(0, 128, (1, 8)),)


def build(line: str, out: Path) -> None:
    words = line.split()
    if words[0] == "text-generation":
        text_generation(words[1], words[2], out)
    elif words[0] == "torchvision":
        lowered(*torchvision_model(words[1], int(words[2])), out)
    elif words == ["lower", "bert"]:
        lowered(*tiny_bert(), out)
    else:
        task, config = words
        export(["--task", task, "--config", config, "--out", str(out / "model.pte")])


def hashes(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` but the inputs a build made itself (its base and adapter)."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.relative_to(directory).parts[0] not in ("base", "tone")
    }


def main(out: Path, lines: list[str]) -> None:
    """Each build in ``lines``' order, but the torchvision ones last (torchvision on the path breaks transformers')."""
    lines = sorted(lines, key=lambda line: line.startswith("torchvision "))
    for index, line in enumerate(lines):
        directory = out / f"build{index}"
        directory.mkdir(parents=True)
        start = time.perf_counter()
        build(line, directory)
        seconds = time.perf_counter() - start
        print(MARK, json.dumps({"build": line, "files": hashes(directory), "seconds": round(seconds, 1)}), flush=True)


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    main(Path(sys.argv[1]), sys.argv[2:])
