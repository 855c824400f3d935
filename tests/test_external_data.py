"""--external-data for every task: the weights in OUT.ptd, none of their bytes in the .pte, the pair verified.

Each task's tiny model goes through the export command as a user runs it
(``--external-data --verify``): the ``.pte`` and ``.ptd`` are written, the
program run with its data file passes ``--verify``, and no parameter's
leading bytes (at the dtype exported) are anywhere in the ``.pte``.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from requires import require

require("transformers", "hf")

from coreai_partitioner.cli import detect, export  # noqa: E402
from coreai_partitioner.cli.main import main  # noqa: E402

#: A tiny config of each task: text generation, vision-language, speech, text-to-text, the encoders.
CONFIGS = ["llama", "llava", "whisper", "t5", "bert", "sentence-bert", "vit"]


def weights_in(pte: bytes, model: torch.nn.Module, dtype: torch.dtype) -> list[str]:
    """The parameters of ``model`` whose first 32 bytes at ``dtype`` are in ``pte``."""
    found = []
    for name, parameter in model.named_parameters():
        if parameter.numel() * parameter.element_size() < 64 or not parameter.is_floating_point():
            continue
        head = parameter.detach().to(dtype).contiguous().flatten()[: 32 // dtype.itemsize]
        if len(set(head.tolist())) > 1 and head.numpy().tobytes() in pte:
            found.append(name)
    return found


def tiny_model(config_name: str) -> torch.nn.Module:
    """The model the command exports for ``--config``: its own loading, seeded."""
    task = detect.tasks()[detect.config_task(config_name)]
    parser = export.build_parser(task)
    args = parser.parse_args(["--config", config_name])
    plan = export.settle(task, args)
    return export.load_model(task, plan, torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
def test_every_task_with_external_data_keeps_no_weight_in_the_pte_and_passes_verify_with_its_ptd(config, tmp_path, capsys):
    out = tmp_path / "model.pte"
    status = main(["export", "--config", config, "--external-data", "--verify", "--out", str(out)])
    printed = capsys.readouterr()
    assert status in (0, None), printed.err
    assert out.is_file() and out.with_suffix(".ptd").is_file()
    pte = out.read_bytes()
    model = tiny_model(config)
    assert not weights_in(pte, model, torch.float32)
    # The control: the same bytes are in the data file.
    assert weights_in(out.with_suffix(".ptd").read_bytes(), model, torch.float32)


def test_external_data_is_a_flag_of_every_task():
    for task in detect.tasks().values():
        args = export.build_parser(task).parse_args(["--external-data", "--config", task.tiny_configs()[0]])
        assert isinstance(args, argparse.Namespace) and args.external_data is True
