"""The LLM exporter as a deployer meets it: tokenizers, clear failures, quiet output, what it writes.

``python -m coreai_partitioner export-llm``, ``coreai-export-llm`` and
``examples/export_llm.py`` are one command (the ``text-generation`` task of :mod:`coreai_partitioner.cli.export`);
most tests run the example, ``test_the_package_command_...`` the package's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from requires import require

require("transformers", "hf")

import tokenizer_files  # noqa: E402
from llm_helpers import ci_sample  # noqa: E402

from coreai_partitioner import text_generation  # noqa: E402
from coreai_partitioner.text_decoder import tokenizer  # noqa: E402
from coreai_partitioner.text_generation import runner, text  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "export_llm.py"
SHAPES = text_generation.DecoderShapes(max_context_len=48, prefill_chunk=16)


def run_example(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def run_package_command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "coreai_partitioner", "export-llm", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=600)


def progress_free(stderr: str) -> list[str]:
    """stderr without the example's own progress bar (tqdm redraws it with carriage returns)."""
    return [line for line in stderr.replace("\r", "\n").splitlines() if line.strip() and "phase" not in line]


# ---------------------------------------------------------------- fast


def test_a_wordlevel_tokenizer_json_is_refused_naming_the_file_and_the_fix(tmp_path):
    from tokenizers import Tokenizer, models

    path = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel(vocab={"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]")).save(str(path))
    with pytest.raises(tokenizer.TokenizerError) as error:
        tokenizer.check(path)
    message = str(error.value)
    assert str(path) in message and "merges" in message and "--no-tokenizer" in message


@pytest.mark.parametrize("kind, loaded_as", [("tokenizer.json", "huggingface"), ("sentencepiece", "sentencepiece"), ("tiktoken", "tiktoken")])
def test_each_tokenizer_kind_is_found_and_loads_as_executorchs_runner_loads_it(kind, loaded_as, tmp_path):
    tokenizer_files.MAKERS[kind](tmp_path / tokenizer_files.FILE_NAMES[kind])
    found = tokenizer.find(tmp_path)
    assert found == tmp_path / tokenizer_files.FILE_NAMES[kind]
    assert tokenizer.check(found).kind == loaded_as


def test_first_layers_cuts_every_per_layer_list():
    config = text_generation.first_layers(text_generation.tiny_config("gemma3_text"), 3)
    assert config.num_hidden_layers == 3 and len(config.layer_types) == 3
    with pytest.raises(ValueError, match="num_layers 9: the model has 4 layers"):
        text_generation.first_layers(text_generation.tiny_config("gemma3_text"), 9)


def test_every_lowering_option_is_a_lower_with_adapters_keyword():
    import inspect

    from coreai_partitioner import CoreAIPartitioner
    from coreai_partitioner.cli import export, flags
    from coreai_partitioner.cli.tasks import text_generation as task
    from coreai_partitioner.quantize.schemes import SCHEMES

    parser = export.build_parser(task)
    options = task.lowering_options(parser.parse_args(["--quantize", "int4", "--full-logits"]))
    assert options == {
        "full_logits": True, "quantize": "int4", "graph_breaks": None, "debug_info": "none", "external_data": False,
        "kv_cache": "fp", "attention_sink": None,  # docs/long-context.md
    }
    keywords = set(inspect.signature(text_generation.lower_with_adapters).parameters) | set(inspect.signature(CoreAIPartitioner).parameters)
    assert set(options) <= keywords
    assert parser.get_default("quantize") is None and set(flags.definitions()["--quantize"]["choices"]) == set(SCHEMES)


@pytest.mark.parametrize("command", [["export-llm"], ["export", "--task", "text-generation"], ["verify"], ["inspect"], ["export-optimum"], []])
def test_every_commands_help_prints_and_exits_0(command, capsys):
    from coreai_partitioner.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_the_chat_answer_ends_at_the_end_of_turn_piece_the_runner_prints():
    from coreai_partitioner.cli.text_runs import answer

    assert answer("The capital of France is Paris.<|im_end|>\n", ["<|im_end|>"]) == "The capital of France is Paris."
    assert answer(" Paris, the", ["<|im_end|>", ""]) == "Paris, the"


def test_runner_output_keeps_a_split_character_until_it_is_whole():
    pieces: list[str] = []
    output = runner._Output(text_generation.TextPieces(pieces.append))
    for chunk in (b"a\xe4", b"\xb8", b"\xad\xf0\x9f", b"\x98\x80!\nPyTorch", b"Observer {}\n"):
        output.feed(chunk)
    output.close()
    assert pieces == ["a", "中", "😀!"] and "".join(pieces) == "a中😀!"


# ---------------------------------------------------------------- through TextLLMRunner


def hf_continuation(model, prompt_ids: list[int], new_tokens: int, eos: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos
        )
    return out[0, len(prompt_ids) :].tolist()


def exported(directory: Path, found: tokenizer.Tokenizer):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
    pte = directory / "out" / "model.pte"
    pte.parent.mkdir()
    pte.write_bytes(text_generation.lower_decoder(model, SHAPES).to_executorch().buffer)
    copies = tokenizer.copy(found, pte.parent)
    return model, pte, copies[0]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sentencepiece", "tiktoken"])
def test_a_checkpoint_with_each_tokenizer_kind_exports_and_generates_through_text_llm_runner(kind, tmp_path):
    import pytorch_tokenizers

    directory, info = tokenizer_files.checkpoint(tmp_path / "checkpoint", kind)
    found = tokenizer.check(tokenizer.find(directory))
    model, pte, copied = exported(directory, found)
    prompt = "hello the lazy dog"
    result = runner.generate(pte, copied, prompt, max_new_tokens=10)

    loader = {"sentencepiece": pytorch_tokenizers.CppSPTokenizer, "tiktoken": pytorch_tokenizers.CppTiktoken}[kind]()
    loader.load(str(copied))
    ids = loader.encode(prompt, 0, 0)
    assert result.prompt_tokens == len(ids)
    wanted = hf_continuation(model, ids, 10, info["eos"])
    assert result.generated_tokens == len([t for t in wanted if t != info["eos"]]) or result.generated_tokens == len(wanted)
    # A piece's bytes: the tokenizer's own table where it has one (a random model's bytes are rarely whole
    # characters, and the binding's decode fails on those as the runner's callback does), else its decode.
    pieces = [info.get("bytes", {}).get(t) or loader.decode(t).encode() for t in wanted if t != info["eos"]]
    assert result.text == b"".join(p for p in pieces if printed_by_the_runner(p)).decode("utf-8", errors="replace")
    # generate_text gives every piece, whole characters.
    shapes = text.runner_shapes(pte)
    assert text.generate_text(pte, copied, prompt, shapes, max_new_tokens=10).text == b"".join(pieces).decode("utf-8", errors="replace")


def printed_by_the_runner(piece: bytes) -> bool:
    """ExecuTorch 1.5.1's runner prints a piece unless it is one byte that is not printable ASCII (``safe_printf``)."""
    return len(piece) != 1 or 0x20 <= piece[0] < 0x7F or piece in (b"\t", b"\n", b"\v", b"\f", b"\r")


@pytest.mark.slow
def test_byte_level_bpe_output_that_splits_multibyte_characters_comes_out_whole(tmp_path):
    # The tokenizer's byte order is chosen so that the first distinct byte tokens greedy decoding of this
    # model yields are the bytes of "é中": a 2 and a 3 byte character, each split over single-byte tokens.
    probe, _ = tokenizer_files.checkpoint(tmp_path / "probe", "tokenizer.json")
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(probe, local_files_only=True).eval()
    prompt = "dog"  # no merge applies: its tokens are its bytes
    prompt_bytes = list(prompt.encode())
    free = hf_continuation(model, prompt_bytes, 12, tokenizer_files.byte_level_bpe(tmp_path / "t.json")["eos"])
    target = "é中".encode()
    seen: list[int] = []
    for token in free:
        if token < 256 and token not in seen and len(seen) < len(target):
            seen.append(token)
    assert len(seen) == len(target), f"greedy decoding repeats too soon: {free}"
    # Byte order: each of the first distinct generated tokens is one byte of ``target``; the prompt's bytes stay.
    order = list(range(256))
    for token, byte in zip(seen, target):
        swap = order.index(byte)
        order[token], order[swap] = order[swap], order[token]
    assert all(order[b] == b for b in prompt_bytes), "a prompt byte was moved; pick another target"

    directory, info = tokenizer_files.checkpoint(tmp_path / "checkpoint", "tokenizer.json", byte_order=order)
    found = tokenizer.check(tokenizer.find(directory))
    model, pte, copied = exported(directory, found)
    pieces: list[str] = []
    result = text.generate_text(pte, copied, prompt, SHAPES, max_new_tokens=12, on_text=pieces.append)

    wanted = hf_continuation(model, [order.index(b) for b in prompt_bytes], 12, info["eos"])
    expected = b"".join(info["bytes"][t] for t in wanted if t != info["eos"]).decode("utf-8", errors="replace")
    assert result.text == expected and "é中" in result.text
    assert "é" in pieces or any("é" in p for p in pieces)  # handed on whole, though it came as two tokens
    assert runner.generate(pte, copied, prompt, max_new_tokens=12).generated_tokens == len(wanted)  # no error


# ---------------------------------------------------------------- the command line


@pytest.mark.slow
@pytest.mark.parametrize("target", ["host", "device"])
def test_a_clean_run_prints_nothing_that_is_not_the_examples_own(target, tmp_path):
    flags = ("--target", target, "--prefill-chunk", "8")  # the tiny Qwen3's window: the device form's longest chunk
    done = run_example("--config", "qwen3", *flags, "--verify", "--out", str(tmp_path / "model.pte"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert progress_free(done.stderr) == []
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Qwen3ForCausalLM (qwen3): 2 layer(s), fp32")
    assert "the .pte's are the eager model's" in done.stdout and lines[-1] == f"wrote {tmp_path / 'model.pte'} and tokenizer.json"
    for noise in ("ODIE", "coreai-torch", "torchao", "_pytree", "INFO", "I tokenizers", "Warning", "Mutation on a buffer"):
        assert noise not in done.stdout, noise


@pytest.mark.slow
def test_a_checkpoint_without_a_tokenizer_exports_with_a_warning(tmp_path):
    directory, _ = tokenizer_files.checkpoint(tmp_path / "checkpoint", None)
    done = run_example("--checkpoint", str(directory), "--out", str(tmp_path / "out" / "model.pte"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (warning,) = progress_free(done.stderr)  # the checkpoint's load prints no bar of its own either
    assert "has no tokenizer" in warning and "--no-tokenizer" in warning
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.pte"]
    quiet = run_example("--checkpoint", str(directory), "--no-tokenizer", "--dry-run", cwd=tmp_path)
    assert quiet.returncode == 0 and progress_free(quiet.stderr) == []


@pytest.mark.slow
def test_bad_input_is_one_line_before_any_export_work_and_leaves_nothing(tmp_path):
    missing = run_example("--checkpoint", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert missing.returncode != 0
    assert progress_free(missing.stderr) == [f"export_llm.py: error: --checkpoint {tmp_path / 'nowhere'}: no such directory; give a local Hugging Face checkpoint directory"]

    directory, _ = tokenizer_files.checkpoint(tmp_path / "checkpoint", None)
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel(vocab={"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(directory / "tokenizer.json"))
    refused = run_example("--checkpoint", str(directory), "--out", str(tmp_path / "out" / "model.pte"), cwd=tmp_path)
    (line,) = progress_free(refused.stderr)
    assert refused.returncode != 0 and "tokenizer.json" in line and "--no-tokenizer" in line
    assert not (tmp_path / "out").exists()  # refused before anything was made


@pytest.mark.slow
def test_a_failure_after_the_export_leaves_no_pte_behind(tmp_path):
    out = tmp_path / "model.pte"
    out.mkdir()  # the finished file cannot take this name
    done = run_example("--config", "llama", "--out", str(out), cwd=tmp_path)
    assert done.returncode != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pte"] and not any(out.iterdir())


@pytest.mark.slow
def test_the_package_command_takes_the_examples_options_and_refuses_a_chat_without_a_template(tmp_path):
    directory, _ = tokenizer_files.checkpoint(tmp_path / "checkpoint", "tokenizer.json")
    done = run_package_command("--checkpoint", str(directory), "--num-layers", "1", "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "llama (family llama.py): 1 layer(s), 1 full attention" in done.stdout

    refused = run_package_command("--checkpoint", str(directory), "--chat", "hello", "--out", str(tmp_path / "out" / "model.pte"), cwd=tmp_path)
    (line,) = progress_free(refused.stderr)
    assert refused.returncode == 1 and line.startswith("python -m coreai_partitioner export-llm: error: --chat:")
    assert "no chat template" in line and "--generate" in line
    tiny = run_package_command("--config", "llama", "--chat", "hello", cwd=tmp_path)
    assert tiny.returncode == 1 and "--chat needs a checkpoint with a chat template" in tiny.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]  # refused before anything was made


@pytest.mark.slow
def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    directory, _ = tokenizer_files.checkpoint(tmp_path / "checkpoint", "sentencepiece")
    done = run_example("--checkpoint", str(directory), "--num-layers", "1", "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "llama (family llama.py): 1 layer(s), 1 full attention" in done.stdout
    assert "composites: rms_norm x3, rope x2, scaled_dot_product_attention x1" in done.stdout
    assert "tokenizer: tokenizer.model (sentencepiece)" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


# ---------------------------------------------------------------- our warnings reach the user, the dependencies' do not


def test_quiet_dependencies_holds_down_the_dependencies_warnings_and_none_of_ours(tmp_path, monkeypatch):
    import logging
    import warnings

    from coreai_partitioner import _compat, console
    from coreai_partitioner.cli import export
    from coreai_partitioner.cli.detect import tasks

    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "warning")  # put back after the test, as the levels below
    levels = {name: logging.getLogger(name).level for name in {**console.LOGGERS, **_compat.PRIVATE_LOGGERS}}
    task = tasks()["text-generation"]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.resetwarnings()  # Python's own filters gone: what is held down, quiet_dependencies holds
            console.quiet_dependencies()
            warnings.warn_explicit("a dependency's deprecation", DeprecationWarning, "x.py", 1, module="torch.fx.x")
            warnings.warn_explicit("TypedStorage is deprecated", UserWarning, "x.py", 1, module="torch.storage")
            args = export.build_parser(task).parse_args(["--checkpoint", str(tmp_path), "--max-seq-len", "8"])
            assert export.choose_tokenizer(task, args) is None  # tmp_path: a checkpoint without a tokenizer
            warnings.warn_explicit("this package's own deprecation", DeprecationWarning, "flags.py", 1, module="coreai_partitioner.cli.flags")
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    said = [str(w.message) for w in caught]
    assert said[0] == "--max-seq-len is deprecated: give --prefill-chunk (the same value)"
    assert said[1].startswith(f"{tmp_path} has no tokenizer") and said[2:] == ["this package's own deprecation"]


#: Every command that exports an LLM: the example, the package's two commands, the console script.
ENTRY_POINTS = {
    "examples/export_llm.py": [sys.executable, str(EXAMPLE)],
    "export-llm": [sys.executable, "-m", "coreai_partitioner", "export-llm"],
    "export": [sys.executable, "-m", "coreai_partitioner", "export"],
    "coreai-export-llm": [str(Path(sys.executable).parent / "coreai-export-llm")],
}


@pytest.mark.slow
# CI's sample: the command and its console script; the example script and the old export-llm spelling in the tier.
@pytest.mark.parametrize("entry", ci_sample(list(ENTRY_POINTS), ["export", "coreai-export-llm"]))
def test_every_entry_point_says_a_tokenizer_is_missing_and_a_flag_is_deprecated_and_nothing_else(entry, tmp_path):
    directory, _ = tokenizer_files.checkpoint(tmp_path / "checkpoint", None)
    line = [*ENTRY_POINTS[entry], "--checkpoint", str(directory), "--max-seq-len", "16", "--dry-run"]
    done = subprocess.run(line, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    deprecated, missing = progress_free(done.stderr)  # the dependencies' output held down
    assert deprecated.endswith("warning: --max-seq-len is deprecated: give --prefill-chunk (the same value)")
    assert "warning: " in missing and f"{directory} has no tokenizer" in missing and "--no-tokenizer" in missing
    assert "T dynamic 1..16" in done.stdout  # the old spelling's value taken
