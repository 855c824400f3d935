"""``python -m coreai_partitioner export``: one command, the task read off the checkpoint's config as optimum-cli does."""

from __future__ import annotations

import json

import pytest

from coreai_partitioner.cli.export import UnknownTask, main, task_of


@pytest.mark.parametrize(
    "config, task",
    [
        ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, "text-generation"),
        ({"architectures": ["Gemma3ForConditionalGeneration"], "vision_config": {}}, "image-text-to-text"),
        ({"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper"}, "automatic-speech-recognition"),
        ({"model_type": "llava", "vision_config": {}, "text_config": {}}, "image-text-to-text"),
        ({"model_type": "whisper", "num_mel_bins": 80}, "automatic-speech-recognition"),
        ({"model_type": "qwen3"}, "text-generation"),
    ],
)
def test_the_task_is_read_off_the_architectures_then_the_config(config, task):
    assert task_of(config) == task


def test_a_config_without_a_model_type_is_refused_naming_the_file():
    with pytest.raises(UnknownTask, match="x/config.json has no model_type and no architectures"):
        task_of({"hidden_size": 8}, "x/config.json")


def test_a_text_checkpoint_goes_to_export_llm_and_a_missing_one_is_one_line(tmp_path, capsys):
    assert main(["--config", "llama", "--dry-run"]) == 0
    assert "forward(tokens [1, T], input_pos [T])" in capsys.readouterr().out
    assert main(["--checkpoint", str(tmp_path / "nowhere")]) == 1
    assert capsys.readouterr().err.strip().endswith("no such directory; give a local Hugging Face checkpoint directory")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"]}))
    assert main(["--checkpoint", str(tmp_path), "--dry-run"]) == 1
    assert f"{tmp_path / 'config.json'} has no model_type and architectures BertForMaskedLM name no task" in capsys.readouterr().err
