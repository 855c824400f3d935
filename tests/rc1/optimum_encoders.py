"""optimum-executorch's ``image-classification`` and ``fill-mask`` tasks with the ``coreai`` recipe, on transformers 5.0.0rc1.

Run by ``tests/test_encoder_tasks.py`` with that transformers first on
``sys.path``.  Saves a tiny random ViT and a tiny random BERT masked LM,
exports each with optimum's ``main_export(task=..., recipe="coreai")``,
loads the ``model.pte`` with the loader optimum's ``ExecuTorchModelFor...``
classes use (``_load_for_executorch``) and calls ``forward`` as they do;
prints one JSON object with each output's largest difference from Hugging
Face eager, the methods and the delegates.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import backend_suite.torchvision_ops  # noqa: E402,F401 - torchvision's operator schemas, before transformers imports it

import transformers  # noqa: E402

import coreai_partitioner.recipes.optimum  # noqa: F401 - registers the coreai recipes

from executorch.extension.pybindings.portable_lib import _load_for_executorch  # noqa: E402
from optimum.exporters.executorch import main_export  # noqa: E402


def tiny_vit() -> transformers.PreTrainedModel:
    config = transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, num_labels=5
    )
    torch.manual_seed(0)
    return transformers.ViTForImageClassification(config).eval()


def tiny_bert() -> transformers.PreTrainedModel:
    config = transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64
    )
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(config).eval()


def exported(model, task: str, directory: Path):
    """``main_export`` of ``model`` saved in ``directory``; the loaded ``model.pte``."""
    model.save_pretrained(directory / "checkpoint")
    main_export(str(directory / "checkpoint"), task=task, recipe="coreai", output_dir=str(directory / "out"))
    return _load_for_executorch(str(directory / "out" / "model.pte"))


def main() -> None:
    report = {"transformers": transformers.__version__}
    with tempfile.TemporaryDirectory() as directory:
        directory = Path(directory)
        vit = tiny_vit()
        program = exported(vit, "image-classification", directory / "vit")
        pixels = torch.randn(1, 3, 32, 32)
        with torch.no_grad():
            expected = vit(pixel_values=pixels).logits
        got = program.forward((pixels,))[0]
        report["image-classification"] = {
            "shape": list(got.shape), "error": float((got - expected).abs().max()), "scale": float(expected.abs().max()),
        }
        bert = tiny_bert()
        program = exported(bert, "fill-mask", directory / "bert")
        errors = []
        for length, padding in ((7, 0), (12, 4), (63, 0)):
            ids = torch.randint(3, 99, (1, length))
            mask = torch.ones_like(ids)
            mask[0, length - padding:] = 0
            with torch.no_grad():
                expected = bert(input_ids=ids, attention_mask=mask).logits
            got = program.forward((ids, mask))[0]
            errors.append({"length": length, "padding": padding, "shape": list(got.shape), "error": float((got - expected).abs().max()), "scale": float(expected.abs().max())})
        report["fill-mask"] = errors
    print(json.dumps(report))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
