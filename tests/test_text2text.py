"""Text-to-text generation (``coreai_partitioner.text2text``): T5 and Flan-T5 as ``encoder`` and ``text_decoder`` in one .pte.

A tiny random T5 (relu, tied head) and a tiny Flan-T5 (gated gelu, a head of
its own), 2 layers each side, seeded (``text2text.tiny``), are lowered and run
in ExecuTorch's runtime (host Core AI backend) as optimum's
``ExecuTorchModelForSeq2SeqLM`` calls the methods: the encoder's output is
Hugging Face's cross-attention keys and values, the logits its own, and the
greedy ids ``generate``'s, at two input lengths of the one dynamic ``T``; the
asset holds the ``rms_norm`` and SDPA composites.  The pieces T5 adds (its
relative position bias, a float bias through the SDPA composite's boolean
mask) are checked against Hugging Face and torch alone, and what the command
refuses before any work.  optimum's own ``main_export`` with the ``coreai``
recipe runs on transformers 5.0.0rc1 in a subprocess (``tests/rc1/optimum_text2text.py``).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from requires import require  # noqa: E402

require("transformers", "hf")

import transformers  # noqa: E402
from device_contract import device_delegate_arguments  # noqa: E402

from coreai_partitioner import save_pte, text2text  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.asset_ir import asset_ir, summarize_ir  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte  # noqa: E402
from coreai_partitioner.blocks.errors import UnsupportedConfig  # noqa: E402
from coreai_partitioner.seq2seq import check as seq2seq_check  # noqa: E402
from coreai_partitioner.text2text import check as text2text_check  # noqa: E402
from coreai_partitioner.text2text.position_bias import RelativePositionBias, attend_with_bias  # noqa: E402
from coreai_partitioner.text2text.tiny import tiny_config, tiny_model, tiny_tokenizer  # noqa: E402

PROMPT = "translate: hello world"
TOKENS = 12
#: The cache and input bounds the tiny .pte files are lowered with (T5's 512 would only slow the tests).
MAX_DECODE_LEN, MAX_INPUT_LEN = 24, 32
#: Both functions' composites: the encoder's 2 layers' 2 norms and attention and its final norm; the decoder's 2
#: layers' 3 norms, self and cross attention, and its final norm.
COMPOSITES = Counter({"rms_norm": 5 + 7, "scaled_dot_product_attention": 2 + 4})


def prompt_ids(text: str = PROMPT) -> torch.Tensor:
    return torch.tensor([tiny_tokenizer().encode(text).ids])


def asset_composites(path: Path, directory: Path) -> Counter:
    return summarize_ir(asset_ir(read_pte(path).coreai_delegates("encoder")[0].asset_path(directory))).composites()


# ---------------------------------------------------------------- fast


@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
def test_the_position_bias_from_constant_tables_is_hfs_compute_bias(bidirectional):
    model = tiny_model("t5")
    stack = model.encoder if bidirectional else model.decoder
    hf = stack.block[0].layer[0].SelfAttention
    bias = RelativePositionBias.of(hf, 40, bidirectional=bidirectional)
    positions = torch.arange(40)
    with torch.no_grad():
        expected = hf.compute_bias(40, 40)
        torch.testing.assert_close(bias(positions, positions), expected, rtol=0, atol=0)
        # a decoder step: the query at position 17 against every slot, as floats (the device form's)
        torch.testing.assert_close(bias(positions[17:18].float(), positions.float()), expected[:, :, 17:18], rtol=0, atol=0)


def test_a_float_bias_through_the_sdpa_composites_boolean_mask_is_an_additive_mask():
    from coreai_torch.composite_ops import SDPA

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 5, 8, generator=generator) for _ in range(3))
    bias = torch.randn(1, 4, 5, 5, generator=generator)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias + torch.where(causal, 0.0, -1e4), scale=1.0)
    got = attend_with_bias(SDPA(scale=1.0), q, k, v, bias, torch.arange(5.0), causal[None, None])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["t5", "flan-t5"])
def test_the_adapted_modules_are_hfs_encoder_and_logits_and_the_device_step_reads_no_unwritten_slot(name):
    from coreai_partitioner.text_decoder.device import DeviceTextDecoder

    model = tiny_model(name)
    adapted = text2text.adapt(model, max_decode_len=MAX_DECODE_LEN, max_input_len=MAX_INPUT_LEN)
    ids = prompt_ids()
    tokens = [0, 73, 243, 183, 128, 206]
    with torch.no_grad():
        torch.testing.assert_close(adapted.encoder.hidden(ids), model.encoder(ids).last_hidden_state, rtol=1e-5, atol=1e-5)
        cross = adapted.encoder(ids)
        expected = model(input_ids=ids, decoder_input_ids=torch.tensor([tokens])).logits[0]
        host = torch.cat([adapted.decoder(torch.tensor([[t]]), cross, torch.tensor([i]))[0] for i, t in enumerate(tokens)])
        for buffer in adapted.decoder.buffers():
            if buffer.is_floating_point() and buffer.dim() == 4:
                buffer.fill_(float("nan"))  # what ExecuTorch may leave in a cache it never initialized
        device = DeviceTextDecoder(adapted.decoder)
        on_device = torch.cat([device(torch.tensor([[t]]), cross, torch.tensor([i]))[0] for i, t in enumerate(tokens)])
    scale = float(expected.abs().max())  # Flan-T5's random logits reach hundreds
    torch.testing.assert_close(host, expected, rtol=1e-4, atol=1e-5 * scale)
    torch.testing.assert_close(on_device, expected, rtol=1e-4, atol=1e-5 * scale)


def test_other_encoder_decoders_and_configs_not_computed_here_are_refused_naming_them():
    with pytest.raises(text2text.UnsupportedText2TextModel, match=r"MT5ForConditionalGeneration \(mt5\): the text2text export takes a T5"):
        text2text.adapt(transformers.MT5ForConditionalGeneration(transformers.MT5Config(**_small())))
    with pytest.raises(text2text.UnsupportedText2TextModel, match="no encoder, decoder and LM head; export a T5ForConditionalGeneration"):
        text2text.adapt(transformers.T5EncoderModel(tiny_config("t5")))
    config = tiny_config("t5")
    config.feed_forward_proj, config.dense_act_fn = "gated-tanh", "tanh"
    refusal = r"t5: config.feed_forward_proj = 'gated-tanh' is not supported; it takes relu, gated-gelu"
    with pytest.raises(UnsupportedConfig, match=refusal) as refused:
        text2text.adapt(transformers.T5ForConditionalGeneration(config))
    assert refused.value.field == "feed_forward_proj"
    with pytest.raises(UnsupportedConfig, match="config.max_input_len = 0 is not supported; it takes at least 1"):
        text2text.adapt(tiny_model("t5"), max_input_len=0)


def _small() -> dict:
    return dict(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)


def test_t5_checkpoints_are_text2text_generation_and_the_tiny_ones_are_its_commands():
    from coreai_partitioner.cli.detect import UnknownTask, config_task, task_of, tasks

    assert tasks()["text2text-generation"].__name__ == "coreai_partitioner.cli.tasks.text2text_generation"
    assert task_of({"architectures": ["T5ForConditionalGeneration"], "model_type": "t5"}) == "text2text-generation"
    assert task_of({"model_type": "t5"}) == "text2text-generation"
    assert task_of({"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper"}) == "automatic-speech-recognition"
    assert task_of({"architectures": ["LlavaForConditionalGeneration"], "model_type": "t5", "vision_config": {}}) == "image-text-to-text"
    with pytest.raises(UnknownTask, match=r"model_type 'mt5' .* text2text-generation \(T5 and Flan-T5"):
        task_of({"architectures": ["MT5ForConditionalGeneration"], "model_type": "mt5"})
    assert config_task("flan-t5") == config_task("t5") == "text2text-generation"


def test_the_command_refuses_bad_input_before_any_work(tmp_path):
    from coreai_partitioner.cli import export
    from coreai_partitioner.cli.tasks import text2text_generation as task

    def settle(*argv):
        return export.settle(task, export.build_parser(task).parse_args([*argv, "--out", str(tmp_path / "out" / "m.pte")]))

    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    other_task = rf"--checkpoint {llama} is a text-generation checkpoint, not text2text-generation; export it with"
    with pytest.raises(export.CommandError, match=other_task):
        settle("--checkpoint", str(llama))
    with pytest.raises(export.CommandError, match=r"--max-input-len 0: give at least 1"):
        settle("--max-input-len", "0")
    with pytest.raises(export.CommandError, match=r"--max-context-len 0: give at least 1"):
        settle("--max-context-len", "0")
    assert not (tmp_path / "out").exists()


def test_the_dry_run_tells_the_methods_from_the_config_alone(capsys):
    from coreai_partitioner.cli import export
    from coreai_partitioner.cli.tasks import text2text_generation as task

    export.run(task, export.build_parser(task).parse_args(["--config", "t5", "--dry-run", "--max-input-len", "48"]))
    printed = capsys.readouterr().out
    assert "t5 (relu): 2 + 2 layers, fp32, host form" in printed
    assert "encoder(input_ids [1, T], T from 1 to 48)" in printed and "64 cache slots" in printed


def test_the_commands_tiny_model_is_the_librarys_at_each_dtype(tmp_path):
    from coreai_partitioner.cli import export
    from coreai_partitioner.cli.tasks import text2text_generation as task

    plan = export.settle(task, export.build_parser(task).parse_args(["--config", "t5", "--out", str(tmp_path / "m.pte")]))
    expected = tiny_model("t5").state_dict()
    for dtype in (torch.float32, torch.float16):
        loaded = export.load_model(task, plan, dtype).state_dict()
        assert loaded.keys() == expected.keys()
        assert all(torch.equal(loaded[name], expected[name].to(loaded[name].dtype)) for name in expected)


def t5_tokenizer(directory: Path) -> Path:
    """A T5 tokenizer as a checkpoint keeps it: a SentencePiece Unigram ``spiece.model`` (``<pad>`` 0, ``</s>`` 1,
    ``<unk>`` 2) and the ``tokenizer.json`` transformers makes of it."""
    import io

    import sentencepiece

    model = io.BytesIO()
    corpus = ["translate English to German: the house is wonderful", "the quick brown fox jumps over the lazy dog"] * 40
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=model, vocab_size=36, model_type="unigram", minloglevel=2,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "spiece.model").write_bytes(model.getvalue())
    transformers.T5TokenizerFast(vocab_file=str(directory / "spiece.model"), extra_ids=0).save_pretrained(directory)
    return directory


def test_the_runner_reads_t5s_spiece_model_and_not_its_unigram_tokenizer_json(tmp_path):
    from coreai_partitioner.text_decoder import tokenizer

    t5_tokenizer(tmp_path)
    assert json.loads((tmp_path / "tokenizer.json").read_text())["model"]["type"] == "Unigram"
    with pytest.raises(tokenizer.TokenizerError, match="huggingface: "):
        tokenizer.check(tmp_path / "tokenizer.json")
    assert tokenizer.choose(tmp_path) == tokenizer.Tokenizer(tmp_path / "spiece.model", "sentencepiece")


# ---------------------------------------------------------------- tiny T5s, lowered


@pytest.mark.slow
@pytest.mark.parametrize("name", ["t5", "flan-t5"])
def test_tiny_t5_host_pte_gives_hfs_encoder_output_logits_and_greedy_ids_at_two_lengths(name, tmp_path):
    model = tiny_model(name)
    path = save_pte(text2text.lower_text2text(model, max_decode_len=MAX_DECODE_LEN, max_input_len=MAX_INPUT_LEN), tmp_path / "model.pte")
    assert asset_composites(path, tmp_path) == COMPOSITES
    program = text2text.Text2TextProgram(path)
    for text in (PROMPT, "a second input, a longer one"):  # one T, then another: the encoder's is dynamic
        reference = text2text_check.reference(model, prompt_ids(text), max_new_tokens=TOKENS)
        # Flan-T5's greedy tokens vary, so a wrong cache shows in the ids too; the random relu T5's tied, rescaled head
        # repeats one, and a wrong cache shows in the logits after each of them.
        assert len(set(reference.ids)) > 2 or name == "t5"
        seq2seq_check.check(program, reference, max_new_tokens=TOKENS).raise_for_mismatch()


@pytest.mark.slow
def test_tiny_t5_device_pte_keeps_the_stock_runtime_contract_and_gives_hfs_greedy_ids(tmp_path):
    model = tiny_model("t5")
    path = save_pte(
        text2text.lower_text2text(model, target="device", max_decode_len=MAX_DECODE_LEN, max_input_len=MAX_INPUT_LEN),
        tmp_path / "model.pte",
    )
    for method, arguments in device_delegate_arguments(path, text2text.METHODS).items():
        assert {argument.dynamism for argument in arguments} <= {"STATIC", "DYNAMIC_BOUND"}, (method, arguments)
    assert read_pte(path).coreai_delegates("encoder")[0].backend_id == "CoreAIBackend"
    program = text2text.Text2TextProgram(path)
    reference = text2text_check.reference(model, prompt_ids(), max_new_tokens=TOKENS)
    for _ in range(2):  # a second input starts at position 0 over what the first left in the caches
        seq2seq_check.check(program, reference, max_new_tokens=TOKENS).raise_for_mismatch()


@pytest.mark.slow
def test_the_export_command_verifies_a_flan_t5_checkpoint_in_fp16_and_answers_a_prompt_through_its_tokenizer(tmp_path, capsys):
    """A checkpoint directory as Hugging Face saves one, with T5's tokenizer: the task read off its config,
    ``spiece.model`` taken for the runner; ``--dtype fp16`` casts the whole model (the MLP's output projection too,
    which HF keeps fp32 when it loads a checkpoint in fp16) and ``--verify`` judges it against HF's own fp16 model."""
    from coreai_partitioner.cli import export

    checkpoint = t5_tokenizer(tmp_path / "flan-t5")
    model = tiny_model("flan-t5")
    model.save_pretrained(checkpoint)
    model.generation_config.save_pretrained(checkpoint)
    out = tmp_path / "out" / "model.pte"
    prompt = "translate the house"
    argv = ["--checkpoint", str(checkpoint), "--dtype", "fp16", "--verify", "--generate", prompt, "--new-tokens", "6",
            "--max-input-len", "32", "--max-context-len", "24", "--out", str(out)]
    assert export.main(argv) == 0
    printed = capsys.readouterr().out
    assert "2 + 2 layers, fp16, host form" in printed
    assert printed.count(" ok\n") == 2  # the encoder's output and the logits, by SNR (fp16's greedy ids: a report)
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "generation_config.json", "model.pte", "spiece.model", "tokenizer.json", "tokenizer_config.json"
    ]
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    with torch.no_grad():
        expected = model.half().generate(tokenizer(prompt, return_tensors="pt").input_ids, max_new_tokens=6, max_length=None)
    answer = tokenizer.decode(expected[0], skip_special_tokens=True).strip()
    assert f"generate: {prompt!r} -> {answer!r}" in printed
    text, decoded = text2text.Text2TextProgram(out).answer(prompt, max_new_tokens=6)
    assert decoded.ids == expected[0].tolist()[1:] and text == answer


@pytest.mark.slow
def test_optimums_main_export_with_the_coreai_recipe_gives_hfs_greedy_ids_for_text2text_generation():
    from test_transformers_rc1 import rc1_report

    report = rc1_report("optimum_text2text.py")
    assert report["transformers"] == "5.0.0rc1"
    assert set(report["methods"]) >= {"encoder", "text_decoder", "decoder_start_token_id", "get_max_seq_len"}
    for result in report["inputs"]:
        assert result["pte"] == result["hf"], result
        assert result["encoder_error"] <= 1e-4 * max(result["scale"], 1.0), result
