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
        ({"architectures": ["MistralForCausalLM"], "model_type": "not_a_family_here"}, "text-generation"),
        ({"model_type": "llava", "vision_config": {}, "text_config": {}}, "image-text-to-text"),
        ({"model_type": "whisper", "num_mel_bins": 80}, "automatic-speech-recognition"),
        ({"architectures": ["Qwen3Model"], "model_type": "qwen3"}, "text-generation"),
    ],
)
def test_the_task_is_read_off_the_architectures_then_the_model_type(config, task):
    assert task_of(config) == task


def test_a_config_without_a_model_type_is_refused_naming_the_file():
    with pytest.raises(UnknownTask, match="x/config.json has no model_type and no architectures"):
        task_of({"hidden_size": 8}, "x/config.json")


def test_a_text_checkpoint_goes_to_export_llm_and_a_missing_one_is_one_line(tmp_path, capsys):
    assert main(["--config", "llama", "--dry-run"]) == 0
    assert "forward(tokens [1, T], input_pos [T])" in capsys.readouterr().out
    assert main(["--checkpoint", str(tmp_path / "nowhere")]) == 1
    assert capsys.readouterr().err.strip().endswith("no such directory; give a local Hugging Face checkpoint directory")


@pytest.mark.parametrize(
    "config, found",
    [
        ({"architectures": ["BertModel"], "model_type": "bert"}, "model_type 'bert' and architectures BertModel"),
        ({"architectures": ["CLIPModel"], "model_type": "clip", "vision_config": {}}, "model_type 'clip' and architectures CLIPModel"),
        ({"architectures": ["BertForSequenceClassification"]}, "model_type None and architectures BertForSequenceClassification"),
    ],
)
def test_a_checkpoint_of_no_task_exported_here_is_refused_naming_what_it_holds_before_loading_weights(
    tmp_path, capsys, config, found
):
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_text("not weights: loading them would fail")
    assert main(["--checkpoint", str(tmp_path), "--out", str(tmp_path / "out" / "model.pte")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'config.json'} has {found}: not a task this command exports" in err
    assert all(task in err for task in ("text-generation (a *ForCausalLM", "image-text-to-text (", "automatic-speech-recognition (Whisper)"))
    assert not (tmp_path / "out").exists()


def test_speechs_own_task_flag_is_reached_through_the_export_command(tmp_path, capsys):
    from coreai_partitioner.cli import export
    from coreai_partitioner.cli.tasks import automatic_speech_recognition as asr
    from coreai_partitioner.speech.tiny import tiny_config, tiny_generation_config

    # Parsed by the speech command (not taken for the export command's --task), which then refuses its decode length.
    with pytest.raises(SystemExit) as exited:
        main(["--config", "whisper", "--speech-task", "translate", "--max-decode-len", "65"])
    assert exited.value.code == 1
    assert "--max-context-len 65: whisper has 64 decoder positions" in capsys.readouterr().err  # the old spelling parses
    # Whisper's own word for it, --task translate, reaches the same flag; on a model of another task it is refused.
    assert main(["--config", "whisper", "--task", "translate", "--dry-run"]) == 0
    assert "decoder prompt: translate to English" in capsys.readouterr().out
    assert main(["--config", "llama", "--task", "translate", "--dry-run"]) == 1
    assert "--task translate is a speech recognition model's prompt" in capsys.readouterr().err
    translate = tiny_generation_config(tiny_config()).task_to_id["translate"]
    args = export.build_parser(asr).parse_args(["--config", "whisper", "--speech-task", "translate", "--out", str(tmp_path / "m.pte")])
    assert translate in export.settle(asr, args).rules.prompt


@pytest.mark.parametrize(
    "task",
    ["text-generation", "image-text-to-text", "automatic-speech-recognition", "text2text-generation", "fill-mask",
     "feature-extraction", "image-classification"],
)
def test_a_task_defines_none_of_the_flags_the_command_shares_and_takes_the_old_spellings_of_its_own(task):
    import argparse
    import importlib

    from coreai_partitioner.cli import export

    module = importlib.import_module(export.TASKS[task])
    own = argparse.ArgumentParser()
    module.add_flags(own)
    shared = {"--config", "--checkpoint", *export._flags(), *export.SHORT.values(), *(a for s in export.HIDDEN.values() for a in s)}
    assert not {name for action in own._actions for name in action.option_strings} & shared
    parser = export.build_parser(module)
    for flag, spellings in export.HIDDEN.items():
        if flag in module.FLAGS:
            dest = flag.lstrip("-").replace("-", "_")
            assert all(getattr(parser.parse_args([spelling, "7"]), dest) == 7 for spelling in (flag, *spellings))
