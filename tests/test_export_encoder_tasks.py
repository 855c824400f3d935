"""The export command's encoder tasks (issue #45): ``fill-mask``, ``feature-extraction``, ``image-classification``.

The task is read off a checkpoint's files before any weights are loaded: a
``*ForMaskedLM``, sentence-transformers' ``modules.json``, a
``*ForImageClassification``; a bare encoder without ``modules.json``, a
masked LM of a type no family adapts, the device form are refused in one
line.  Each task then exports a tiny random model through the command, in
process, with ``--verify``, and the ``.pte`` written gives Hugging Face
eager's outputs in ExecuTorch's runtime on the inputs the files written
beside it make (the tokenizer, the image processor).  all-MiniLM-L6-v2
(real weights, from a registry package) exported by the command gives
sentence-transformers' embeddings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from requires import require

require("transformers", "hf")

import transformers  # noqa: E402

from coreai_partitioner.cli.detect import checkpoint_task, config_task, task_of, tasks  # noqa: E402
from coreai_partitioner.cli.export import main  # noqa: E402

BERT = {"model_type": "bert", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 64}
MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def checkpoint(directory: Path, config: dict, *, sentence: dict | None = None) -> Path:
    """A checkpoint directory of ``config`` (and sentence-transformers' files with the ``sentence`` pooling config),
    whose weights file is not weights: a test that loads it fails."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "model.safetensors").write_text("not weights: loading them would fail")
    if sentence is not None:
        (directory / "modules.json").write_text(json.dumps(MODULES))
        (directory / "1_Pooling").mkdir()
        (directory / "1_Pooling" / "config.json").write_text(json.dumps(sentence))
    return directory


def refused(argv: list[str], capsys) -> str:
    """The one line the command refuses ``argv`` with (exit status 1)."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


# ---------------------------------------------------------------- which task, before any weights


@pytest.mark.parametrize(
    "architecture, task",
    [
        ("BertForMaskedLM", "fill-mask"),
        ("DistilBertForMaskedLM", "fill-mask"),
        ("DebertaV2ForMaskedLM", "fill-mask"),  # the task's; the task refuses the type
        ("ViTForImageClassification", "image-classification"),
        ("DeiTForImageClassificationWithTeacher", "image-classification"),
        ("ConvNextForImageClassification", "image-classification"),  # lowered whole
    ],
)
def test_an_encoder_heads_task_is_read_off_the_architectures(architecture, task):
    assert task_of({"architectures": [architecture], "model_type": "any"}) == task


def test_a_checkpoint_with_sentence_transformers_modules_is_feature_extraction_whatever_its_head(tmp_path):
    for architecture in ("BertModel", "BertForMaskedLM"):
        config = {**BERT, "architectures": [architecture]}
        assert checkpoint_task(checkpoint(tmp_path / architecture, config, sentence={"pooling_mode": "mean"})) == "feature-extraction"
    assert checkpoint_task(checkpoint(tmp_path / "mlm", {**BERT, "architectures": ["BertForMaskedLM"]})) == "fill-mask"


def test_a_bare_encoder_without_modules_json_is_refused_naming_what_it_holds_and_the_fix(tmp_path, capsys):
    directory = checkpoint(tmp_path / "bert", {**BERT, "architectures": ["BertModel"]})
    assert main(["--checkpoint", str(directory), "--out", str(tmp_path / "out" / "model.pte")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "has model_type 'bert' and architectures BertModel" in err
    assert "feature-extraction from a sentence-transformers checkpoint (modules.json beside config.json" in err
    assert "fill-mask from a *ForMaskedLM checkpoint" in err
    assert not (tmp_path / "out").exists()


def test_a_masked_lm_of_a_type_no_family_adapts_is_refused_with_the_librarys_error_before_its_weights(tmp_path, capsys):
    directory = checkpoint(tmp_path / "deberta", {"model_type": "deberta-v2", "architectures": ["DebertaV2ForMaskedLM"]})
    err = refused(["--checkpoint", str(directory), "--out", str(tmp_path / "out" / "model.pte")], capsys)
    assert "model_type 'deberta-v2' is not a text encoder this path adapts (bert, distilbert, roberta)" in err
    assert not (tmp_path / "out").exists()


def test_a_pooling_not_computed_here_is_refused_before_the_weights(tmp_path, capsys):
    directory = checkpoint(tmp_path / "st", {**BERT, "architectures": ["BertModel"]}, sentence={"pooling_mode": "weightedmean"})
    err = refused(["--checkpoint", str(directory), "--out", str(tmp_path / "out" / "model.pte")], capsys)
    assert "pooling mode 'weightedmean' is not computed here" in err


def test_a_forced_task_refuses_a_checkpoint_of_another(tmp_path, capsys):
    directory = checkpoint(tmp_path / "st", {**BERT, "architectures": ["BertModel"]}, sentence={"pooling_mode": "mean"})
    err = refused(["--task", "fill-mask", "--checkpoint", str(directory), "--dry-run"], capsys)
    assert f"--checkpoint {directory} is a feature-extraction checkpoint, not fill-mask" in err


@pytest.mark.parametrize("name", ["bert", "sentence-roberta", "vit"])
def test_the_encoder_tasks_take_the_host_form_only(name, capsys):
    assert "exports the host form only" in refused(["--config", name, "--target", "device", "--dry-run"], capsys)


def test_an_input_longer_than_the_position_table_or_a_bound_of_two_is_refused_naming_the_range(capsys):
    err = refused(["--config", "bert", "--max-input-len", "65", "--dry-run"], capsys)
    assert "--max-input-len 65: bert's position table numbers 64 tokens; give 3 to 64" in err
    assert "--max-batch 2: give 1 or at least 3" in refused(["--config", "sentence-bert", "--max-batch", "2", "--dry-run"], capsys)


def test_every_tiny_config_name_is_one_tasks():
    names = {task: module.tiny_configs() for task, module in tasks().items()}
    every = [name for task_names in names.values() for name in task_names]
    assert len(every) == len(set(every)), sorted(n for n in every if every.count(n) > 1)
    assert all(config_task(name) == task for task, task_names in names.items() for name in task_names)


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--config", "roberta"], "forward(input_ids [B, T], attention_mask [B, T]) -> logits [B, T, 193]; T 1 to 64, B 1 to 1"),
        (["--config", "sentence-bert", "--max-input-len", "16", "--max-batch", "4"],
         "-> embeddings [B, 32] (mean, unit length); T 1 to 16, B 1 to 4"),
        (["--config", "deit"], "forward(pixel_values [1, 3, 32, 32]) -> logits [1, 5]"),
    ],
)
def test_each_encoder_tasks_dry_run_says_its_method_from_the_config_alone(argv, said, tmp_path, capsys):
    assert main([*argv, "--dry-run", "--out", str(tmp_path / "model.pte")]) == 0
    assert said in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


def test_a_checkpoints_dry_run_reads_its_pooling_and_maximum_length_from_its_files(tmp_path, capsys):
    directory = checkpoint(tmp_path / "st", {**BERT, "architectures": ["BertModel"]}, sentence={"pooling_mode_cls_token": True})
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 24}))
    assert main(["--checkpoint", str(directory), "--dry-run"]) == 0
    said = capsys.readouterr()
    assert "-> embeddings [B, 32] (cls, unit length); T 1 to 24, B 1 to 1" in said.out
    assert "has none of tokenizer.json" in said.err  # a warning: its caller must tokenize itself


# ---------------------------------------------------------------- the command, tiny models, the .pte in the runtime


def run_forward(path: Path, *inputs: torch.Tensor) -> torch.Tensor:
    """``forward`` of the ``.pte`` at ``path`` in ExecuTorch's runtime (the host Core AI backend; the program
    ``--verify`` loaded, when it has the same bytes)."""
    from coreai_partitioner import verify

    (output,) = verify.run(path, *inputs)
    return output


def seeded(auto: type, config) -> torch.nn.Module:
    """The tiny model the command exports: seeded 0, made in fp32 (``export.load_model``)."""
    torch.manual_seed(0)
    return auto.from_config(config, dtype=torch.float32, attn_implementation="eager").eval()


def exported(argv: list[str], out: Path, capsys) -> str:
    """Run the command; its output, after checking the .pte was kept because --verify passed."""
    assert main([*argv, "--verify", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "\nok\n" in said and out.is_file(), said
    return said


@pytest.mark.slow
@pytest.mark.parametrize("config", ["vit", "roberta", "sentence-distilbert"])
def test_at_fp16_the_command_judges_the_pte_against_the_model_at_fp16(config, tmp_path, capsys):
    """``--dtype fp16 --verify``: the ``.pte`` is judged against the model at fp16 (the task's eager outputs, taken
    after the lowering) within the runtime's fp16 tolerance, and reported against the fp32 model."""
    said = exported(["--config", config, "--dtype", "fp16"], tmp_path / config / "model.pte", capsys)
    assert "against the eager model (fp16), the check:" in said and "against the fp32 model (a report)" in said, said
    assert "eager reference" in said


@pytest.mark.slow
def test_fill_mask_through_the_command_gives_hf_eagers_logits_on_its_tokenizers_ids(tmp_path, capsys):
    from coreai_partitioner.text_encoder.tiny import tiny_config

    out = tmp_path / "fill-mask" / "model.pte"
    said = exported(["--config", "roberta"], out, capsys)
    assert "wrote" in said and "tokenizer.json" in said
    tokenizer = transformers.AutoTokenizer.from_pretrained(out.parent)  # the files written beside the .pte
    batch = tokenizer(["The cat <mask> on the mat."], return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    got = run_forward(out, ids, mask)
    with torch.no_grad():
        expected = seeded(transformers.AutoModelForMaskedLM, tiny_config("roberta"))(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_feature_extraction_through_the_command_gives_each_padded_text_its_pooled_embedding(tmp_path, capsys):
    from coreai_partitioner.text_encoder.tiny import tiny_config

    out = tmp_path / "feature-extraction" / "model.pte"
    exported(["--config", "sentence-distilbert", "--max-batch", "3"], out, capsys)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out.parent)
    batch = tokenizer(["A man is playing a guitar.", "Hi."], padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert bool((mask == 0).any())  # the shorter text is padded
    got = run_forward(out, ids, mask)
    with torch.no_grad():
        states = seeded(transformers.AutoModel, tiny_config("sentence-distilbert"))(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = mask.unsqueeze(-1).float()
    expected = torch.nn.functional.normalize((states * weights).sum(1) / weights.sum(1), dim=-1)  # sentence-transformers' mean
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_image_classification_through_the_command_gives_hf_eagers_logits_on_its_processors_pixels(tmp_path, capsys):
    import numpy as np

    from coreai_partitioner.image_classification.tiny import tiny_config

    out = tmp_path / "image-classification" / "model.pte"
    exported(["--config", "vit"], out, capsys)
    processor = transformers.AutoImageProcessor.from_pretrained(out.parent)
    image = (np.random.default_rng(0).random((48, 40, 3)) * 255).astype("uint8")
    pixels = processor(images=image, return_tensors="pt")["pixel_values"]
    got = run_forward(out, pixels)
    with torch.no_grad():
        expected = seeded(transformers.AutoModelForImageClassification, tiny_config("vit"))(pixel_values=pixels).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
