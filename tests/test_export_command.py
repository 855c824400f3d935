"""``python -m coreai_partitioner export``: one command, the task read off the checkpoint's config as optimum-cli does."""

from __future__ import annotations

import json

import pytest

from coreai_partitioner.cli.detect import UnknownTask, task_of
from coreai_partitioner.cli.export import main


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
    from coreai_partitioner.speech_recognition.tiny import tiny_config, tiny_generation_config

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

    from coreai_partitioner.cli import detect, export, flags

    module = detect.tasks()[task]
    own = argparse.ArgumentParser()
    module.add_flags(own)
    shared = {"--config", "--checkpoint", *flags.definitions(), *flags.SHORT.values(), *(a for s in flags.DEPRECATED.values() for a in s)}
    assert not {name for action in own._actions for name in action.option_strings} & shared
    parser = export.build_parser(module)
    for flag, spellings in flags.DEPRECATED.items():
        if flag in module.FLAGS:
            dest = flag.lstrip("-").replace("-", "_")
            assert all(getattr(parser.parse_args([spelling, "7"]), dest) == 7 for spelling in (flag, *spellings))


# ---------------------------------------------------------------- a task is one module


def test_every_module_of_the_tasks_folder_is_a_task_that_declares_how_it_is_detected():
    from pathlib import Path

    from coreai_partitioner.cli import detect, tasks

    files = sorted(p.stem for p in Path(tasks.__file__).parent.glob("*.py") if p.stem != "__init__")
    assert sorted(module.__name__.rpartition(".")[2] for module in detect.tasks().values()) == files
    for name, module in detect.tasks().items():
        assert isinstance(module.DETECT, detect.Detection) and module.DETECT.takes, name
        assert module.DETECT.heads or module.DETECT.model_types or module.DETECT.files, f"{name}: nothing detects it"


def test_of_two_heads_an_architecture_matches_the_one_asking_more_of_the_config_decides():
    assert task_of({"architectures": ["WhisperForCausalLM"], "model_type": "whisper"}) == "automatic-speech-recognition"
    assert task_of({"architectures": ["T5ForConditionalGeneration"], "model_type": "t5"}) == "text2text-generation"
    assert task_of({"architectures": ["LlavaForConditionalGeneration"], "model_type": "t5", "vision_config": {}}) == "image-text-to-text"


def test_no_two_tasks_adapt_one_model_type():
    from coreai_partitioner.cli.detect import tasks

    claimed = [t for m in tasks().values() for t in (m.DETECT.model_types() if callable(m.DETECT.model_types) else m.DETECT.model_types)]
    assert claimed and len(claimed) == len(set(claimed)), sorted(t for t in claimed if claimed.count(t) > 1)


@pytest.mark.parametrize(
    "task, other, said",
    [
        ("text-generation", "whisper", "is a automatic-speech-recognition checkpoint, not text-generation"),
        ("text-generation", "gemma3", "is a image-text-to-text checkpoint, not text-generation"),
        ("automatic-speech-recognition", "qwen3", "is a text-generation checkpoint, not automatic-speech-recognition"),
        ("text2text-generation", "llama", "is a text-generation checkpoint, not text2text-generation"),
        # a task's own words where it has them (DETECT.own_refusal)
        ("image-text-to-text", "qwen3", "qwen3: the checkpoint has no vision_config, so it is not a vision-language model"),
    ],
)
def test_every_task_refuses_a_checkpoint_of_another_before_its_own_checks(task, other, said, tmp_path, capsys):
    from coreai_partitioner.cli.detect import config_task, tasks

    tasks()[config_task(other)].tiny_config(other).save_pretrained(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["--task", task, "--checkpoint", str(tmp_path), "--dry-run"])
    err = capsys.readouterr().err
    assert exited.value.code == 1 and said in err and err.count("\n") == 1


# ---------------------------------------------------------------- one meaning per flag name


@pytest.mark.filterwarnings("default::FutureWarning")
@pytest.mark.parametrize("old, flag, dest", [("--max-seq-len", "--prefill-chunk", "prefill_chunk"), ("--max-decode-len", "--max-context-len", "max_context_len")])
def test_an_old_spelling_of_an_export_flag_parses_with_a_deprecation_naming_the_flag(old, flag, dest):
    from coreai_partitioner.cli import export
    from coreai_partitioner.cli.detect import tasks

    with pytest.warns(FutureWarning, match=f"{old} is deprecated: give {flag}"):
        args = export.build_parser(tasks()["text-generation"]).parse_args([old, "9"])
    assert getattr(args, dest) == 9


@pytest.mark.filterwarnings("default::FutureWarning")
def test_export_optimum_takes_the_export_commands_dtype_and_cache_length_and_its_old_spellings_with_a_line_each(tmp_path, capsys):
    from coreai_partitioner.cli.main import build_parser
    from coreai_partitioner.cli.main import main as package_main

    line = ["export-optimum", "--model", "m", "--output-dir", str(tmp_path)]
    args = build_parser().parse_args([*line, "--max-context-len", "512", "--dtype", "fp16"])
    assert (args.max_context_len, args.dtype) == (512, "fp16")
    assert build_parser().parse_args(line).max_context_len == 2048
    with pytest.warns(FutureWarning) as said:
        args = build_parser().parse_args([*line, "--max-seq-len", "256", "--dtype", "float16"])
    assert (args.max_context_len, args.dtype) == (256, "fp16")
    assert [str(w.message) for w in said] == ["--max-seq-len is deprecated: give --max-context-len (the same value)", "--dtype float16 is deprecated: give --dtype fp16"]
    # the command's own line on standard error (here before argparse stops it: it has no --model)
    with pytest.raises(SystemExit):
        package_main(["export-optimum", "--output-dir", str(tmp_path), "--max-seq-len", "256"])
    err = capsys.readouterr().err
    assert err.startswith("python -m coreai_partitioner export-optimum: warning: --max-seq-len is deprecated: give --max-context-len")
