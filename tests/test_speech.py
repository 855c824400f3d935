"""Speech recognition (``coreai_partitioner.speech_recognition``): Whisper as ``encoder`` and ``text_decoder`` in one .pte.

Real Whisper base (``tests/real_whisper.py``, from the registry packages'
CTranslate2 model) on the committed recordings (``tests/speech/*.wav``,
espeak-ng; ``tests/speech/make.sh`` made them): each form is exported once
(module fixtures) and every recording goes through it in ExecuTorch's runtime
(host Core AI backend), as ExecuTorch's ASR runner calls the methods, against
Hugging Face's ``generate`` (English transcription, no timestamps, its own
logits processors).  A tiny random Whisper (``speech.tiny``) checks the same
in both forms, and what the command refuses before any work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import wave
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from requires import require  # noqa: E402

require("transformers", "hf")

import real_whisper  # noqa: E402
from llm_helpers import perturb_channels  # noqa: E402
from device_contract import device_delegate_arguments  # noqa: E402

from coreai_partitioner import save_pte, speech_recognition  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.asset_ir import asset_ir, summarize_ir  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte  # noqa: E402
from coreai_partitioner.speech_recognition import check as speech_check  # noqa: E402
from coreai_partitioner.speech_recognition.device import DeviceTextDecoder  # noqa: E402
from coreai_partitioner.speech_recognition.tiny import tiny_config, tiny_generation_config, tiny_model  # noqa: E402
from coreai_partitioner.verify import fidelity  # noqa: E402

RECORDINGS = sorted((Path(__file__).parent / "speech").glob("*.wav"))
#: What espeak-ng was asked to say (tests/speech/make.sh).
SPOKEN = {
    "fox": "The quick brown fox jumps over the lazy dog.",
    "kitchen": "Please turn off the lights in the kitchen before you leave.",
    "library": "She borrowed three books from the library on Monday.",
}
TINY_TOKENS = 12


def require_whisper_base() -> Path:
    """The Whisper base packages' ``data/`` folder: without them a skip locally, a failure under CI (``requires``)."""
    for package in real_whisper.PACKAGES:
        require(package, install=f"{real_whisper.INSTALL} (README's test command)")
    return real_whisper.package_data()


def assert_device_contract(path: Path) -> None:
    """What upstream's device runtime requires of every delegate, read off the .pte; every shape static."""
    for arguments in device_delegate_arguments(path, speech_recognition.METHODS).values():
        assert all(argument.dynamism == "STATIC" for argument in arguments), arguments


def asset_composites(path: Path) -> Counter:
    with tempfile.TemporaryDirectory() as directory:
        return summarize_ir(asset_ir(read_pte(path).coreai_delegates("encoder")[0].asset_path(directory))).composites()


def write_wav(path: Path, rate: int, channels: int, seconds: float) -> Path:
    with wave.open(str(path), "wb") as file:
        file.setnchannels(channels)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(np.zeros(int(rate * seconds) * channels, dtype="<i2").tobytes())
    return path


# ---------------------------------------------------------------- fast


def test_log_mel_is_whisper_feature_extractors_on_every_recording():
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=80)
    assert np.array_equal(speech_recognition.mel_filters(), extractor.mel_filters)
    for wav in RECORDINGS:
        audio = speech_recognition.read_wav(wav)
        expected = extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
        torch.testing.assert_close(speech_recognition.log_mel(audio), expected, rtol=0, atol=1e-6)


def test_feature_settings_round_trip_through_hfs_preprocessor_config(tmp_path):
    from transformers import WhisperFeatureExtractor

    speech_recognition.FeatureSettings(n_mels=128).write(tmp_path)
    extractor = WhisperFeatureExtractor.from_pretrained(tmp_path)
    assert (extractor.feature_size, extractor.hop_length, extractor.chunk_length, extractor.n_fft) == (128, 160, 30, 400)
    assert speech_recognition.FeatureSettings.read(tmp_path) == speech_recognition.FeatureSettings(n_mels=128)


def test_a_recording_not_16_khz_mono_or_longer_than_the_window_is_refused_with_the_fix(tmp_path):
    with pytest.raises(speech_recognition.AudioError, match=r"44100 Hz, 1 channel\(s\); the model takes 16000 Hz mono: convert it: sox"):
        speech_recognition.read_wav(write_wav(tmp_path / "cd.wav", 44100, 1, 0.5))
    with pytest.raises(speech_recognition.AudioError, match=r"16000 Hz, 2 channel\(s\); the model takes 16000 Hz mono"):
        speech_recognition.read_wav(write_wav(tmp_path / "stereo.wav", 16000, 2, 0.5))
    with pytest.raises(speech_recognition.AudioError, match=r"31.0 s; the model's window is 30 s: cut the recording"):
        speech_recognition.read_wav(write_wav(tmp_path / "long.wav", 16000, 1, 31))
    (tmp_path / "text.wav").write_text("not a wav")
    with pytest.raises(speech_recognition.AudioError, match="not a PCM wav file"):
        speech_recognition.read_wav(tmp_path / "text.wav")


def test_decoding_rules_are_generates_english_transcription_prompt_and_suppressions():
    generation = tiny_generation_config(tiny_config())
    rules = speech_recognition.DecodingRules.of(generation)
    assert rules.prompt == (257, 258, 260, 261)  # <|startoftranscript|><|en|><|transcribe|><|notimestamps|>
    assert rules.eos_ids == (256,) and rules.begin_suppress == (32, 256)
    logits = torch.zeros(262)
    logits[32], logits[5] = 2.0, 1.0
    assert rules.pick(logits, 0) == 5 and rules.pick(logits, 1) == 32  # a space is suppressed at the first token only
    with pytest.raises(speech_recognition.DecodingError, match="language 'fr': the model knows en"):
        speech_recognition.DecodingRules.of(generation, language="fr")


@pytest.mark.slow
def test_device_decoder_reads_no_slot_it_has_not_written():
    model = tiny_model()
    adapted = speech_recognition.adapt(model)
    decoder = DeviceTextDecoder(adapted.decoder)
    features = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(0))
    ids = [257, 258, 260, 261, 40, 41]
    with torch.no_grad():
        cross = adapted.encoder(features)
        expected = model(input_features=features, decoder_input_ids=torch.tensor([ids])).logits[0]
        for buffer in adapted.decoder.buffers():
            buffer.fill_(float("nan"))  # what ExecuTorch 1.5.1 left in an fp16 cache after the encoder ran
        got = torch.cat([decoder(torch.tensor([[t]]), cross, torch.tensor([i]))[0] for i, t in enumerate(ids)])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_whisper_checkpoints_are_speech_recognition_and_the_tiny_one_is_the_speech_commands():
    from coreai_partitioner.cli.detect import config_task, task_of, tasks

    assert task_of({"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper"}) == "automatic-speech-recognition"
    assert tasks()["automatic-speech-recognition"].__name__ == "coreai_partitioner.cli.tasks.automatic_speech_recognition"
    assert config_task("whisper") == "automatic-speech-recognition"


def test_the_command_refuses_bad_input_before_any_work(tmp_path):
    from coreai_partitioner.cli import export
    from coreai_partitioner.cli.tasks import automatic_speech_recognition as asr

    def settle(*argv):
        return export.settle(asr, export.build_parser(asr).parse_args([*argv, "--out", str(tmp_path / "out" / "m.pte")]))

    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    with pytest.raises(export.CommandError, match=rf"--checkpoint {llama} is a text-generation checkpoint, not automatic-speech-recognition; export it with"):
        settle("--checkpoint", str(llama))
    with pytest.raises(speech_recognition.AudioError, match="the model takes 16000 Hz mono"):
        settle("--transcribe", str(write_wav(tmp_path / "cd.wav", 44100, 2, 0.5)))
    with pytest.raises(speech_recognition.AudioError, match="the model's window is 30 s"):
        settle("--transcribe", str(write_wav(tmp_path / "long.wav", 16000, 1, 30.5)))
    with pytest.raises(export.CommandError, match=r"--max-context-len 65: whisper has 64 decoder positions; give 1 to 64"):
        settle("--max-decode-len", "65")
    with pytest.raises(export.CommandError, match=r"--encoder-dtype fp16 under --dtype fp32: .*; give --dtype fp16"):
        settle("--encoder-dtype", "fp16")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_ctranslate2_model_reads_as_212_tensors_and_splits_into_hfs_whisper_parameters():
    data = require_whisper_base()
    variables = real_whisper.read_ctranslate2(real_whisper.model_bin())
    assert len(variables) == 212 + 1  # and the alias of the tied output projection
    state = real_whisper.hf_state_dict(variables)
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    with torch.device("meta"):
        model = WhisperForConditionalGeneration(WhisperConfig(**real_whisper._config(variables, json.loads((data / "config.json").read_text()))))
    expected = {name: tuple(p.shape) for name, p in model.state_dict().items() if name != "proj_out.weight"}
    assert {name: tuple(a.shape) for name, a in state.items()} == expected


# ---------------------------------------------------------------- tiny Whisper, both forms


@pytest.mark.slow
def test_tiny_whisper_device_pte_gives_hfs_encoder_output_logits_and_greedy_ids(tmp_path):
    model = tiny_model()
    features = speech_recognition.log_mel(speech_recognition.read_wav(RECORDINGS[0]))
    reference = speech_check.reference(model, features, max_new_tokens=TINY_TOKENS)
    assert len(set(reference.ids)) > 2  # a random model whose tokens vary, so a wrong cache shows
    path = save_pte(speech_recognition.lower_speech(model, target="device"), tmp_path / "model.pte")
    assert_device_contract(path)
    # Both functions' composites: the encoder's 2 + 2 layers' LayerNorms and attentions, the decoder's self and cross.
    assert asset_composites(path) == Counter({"layer_norm": 5 + 7, "scaled_dot_product_attention": 2 + 4})
    program = speech_recognition.SpeechProgram(path)
    for _ in range(2):  # a second utterance starts at position 0 over what the first left in the caches
        speech_check.check(program, reference, max_new_tokens=TINY_TOKENS).raise_for_mismatch()
    # A conversion that gets one weight wrong: the right .pte against a twin whose last encoder (decoder) layer's
    # MLP output projection has each channel scaled in [0, 2] fails on the encoder's output (on the logits only).
    for part in ("encoder", "decoder"):
        twin = tiny_model()
        perturb_channels(getattr(twin.model, part).layers[-1].fc2.weight)
        report = speech_check.check(program, speech_check.reference(twin, features, max_new_tokens=TINY_TOKENS),
                                    max_new_tokens=TINY_TOKENS)
        encoder_output, logits = report.signal.outputs
        assert not report.ok and not logits.ok and encoder_output.ok is (part == "decoder"), report


@pytest.mark.slow  # lowers and runs both methods
def test_an_fp32_encoder_under_an_fp16_decoder_is_verified_against_hf_run_at_those_dtypes(tmp_path, capsys):
    """``export --dtype fp16 --encoder-dtype fp32``: the encoder and the cross-attention key and value projections
    in fp32 (``speech_recognition.at_precision``), the rest in fp16; ``encoder``'s output rounded once to fp16, the dtype
    ``text_decoder`` takes; ``--verify`` against Hugging Face's own forward of the model at those dtypes."""
    from coreai_partitioner.cli import export
    from coreai_partitioner.cli.tasks import automatic_speech_recognition as asr

    model = speech_recognition.at_precision(tiny_model(), torch.float16, encoder_dtype=torch.float32)
    cross_attention = model.model.decoder.layers[0].encoder_attn
    assert {p.dtype for p in model.model.encoder.parameters()} == {cross_attention.k_proj.weight.dtype} == {torch.float32}
    assert cross_attention.q_proj.weight.dtype == model.proj_out.weight.dtype == torch.float16
    out = tmp_path / "model.pte"
    export.run(asr, export.build_parser(asr).parse_args(
        ["--config", "whisper", "--dtype", "fp16", "--encoder-dtype", "fp32", "--target", "device", "--verify", "--out", str(out)]
    ))
    printed = capsys.readouterr().out
    assert "2 + 2 layers, fp16, encoder fp32, device form" in printed and "both of the fp16, encoder fp32 model:" in printed
    assert printed.count(" ok\n") == 2  # the encoder's output and the logits, by SNR
    assert_device_contract(out)
    features = speech_recognition.log_mel(speech_recognition.read_wav(RECORDINGS[0]))
    cross = speech_recognition.SpeechProgram(out).encoder(features)
    assert cross.dtype == torch.float16
    # Computed in fp32 and rounded once: far closer to the fp32 model's than fp16's tolerance asks (17.5 dB).
    reference = speech_check.reference(tiny_model(), features, max_new_tokens=1)
    assert fidelity.snr_psnr(cross.float(), reference.cross)[0] > 60


@pytest.mark.slow
def test_the_export_command_verifies_a_tiny_whisper_against_hf_and_transcribes_a_recording(tmp_path):
    out = tmp_path / "out" / "model.pte"
    command = [sys.executable, "-m", "coreai_partitioner", "export", "--config", "whisper", "--verify",
               "--transcribe", str(RECORDINGS[0]), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 + 2 layers, fp32, host form" in done.stdout and "\n  same\n" in done.stdout  # --verify: HF's greedy ids
    assert done.stdout.count(" ok\n") == 2  # the encoder's output and the first logits, by SNR
    assert f"transcribe {RECORDINGS[0].name} (3.4 s): " in done.stdout
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "generation_config.json", "model.pte", "preprocessor_config.json", "tokenizer.json"
    ]
    assert read_pte(out).coreai_delegates("encoder")[0].backend_id == "CoreAICompositeBackend"
    assert [line for line in done.stderr.splitlines() if line.strip()] == []  # nothing but the command's own output


# ---------------------------------------------------------------- real Whisper base


@pytest.fixture(scope="module")
def whisper_base(tmp_path_factory) -> Path:
    require_whisper_base()
    return real_whisper.whisper_base_checkpoint(tmp_path_factory.mktemp("whisper") / "whisper-base")


@pytest.fixture(scope="module")
def hf_greedy(whisper_base) -> dict[str, dict]:
    """Hugging Face ``generate`` on every recording (fp32 eager): the features, its ids and its text."""
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    processor = WhisperProcessor.from_pretrained(whisper_base)
    model = WhisperForConditionalGeneration.from_pretrained(whisper_base).eval()
    found = {}
    for wav in RECORDINGS:
        features = processor(speech_recognition.read_wav(wav), sampling_rate=16000, return_tensors="pt").input_features
        with torch.no_grad():
            ids = model.generate(features, language="en", task="transcribe")[0].tolist()
        found[wav.stem] = {"features": features, "ids": ids, "text": processor.decode(ids, skip_special_tokens=True).strip()}
    return found


def exported(whisper_base: Path, target: str, directory: Path) -> Path:
    """The checkpoint exported by the command's own road (``export --checkpoint``), its files beside the .pte."""
    from coreai_partitioner.cli import export
    from coreai_partitioner.cli.tasks import automatic_speech_recognition as asr

    args = export.build_parser(asr).parse_args(["--checkpoint", str(whisper_base), "--target", target, "--out", str(directory / "model.pte")])
    export.run(asr, args)
    return directory / "model.pte"


@pytest.fixture(scope="module")
def device_run(whisper_base, hf_greedy, tmp_path_factory) -> dict:
    """The device form, end to end on every recording as the ASR runner runs it: ``encoder``, then
    ``text_decoder`` a token a call in the same loaded program."""
    path = exported(whisper_base, "device", tmp_path_factory.mktemp("device"))
    program = speech_recognition.SpeechProgram(path)
    rules = speech_recognition.DecodingRules.read(path.parent)
    found = {"path": path}
    for stem, expected in hf_greedy.items():
        cross = program.encoder(expected["features"])
        found[stem] = {"cross": cross, "decoded": speech_recognition.decode(program.text_decoder, cross, rules, max_decode_len=program.max_decode_len)}
    return found


@pytest.mark.slow
def test_whisper_base_made_from_the_ctranslate2_model_transcribes_the_recordings_in_hf(hf_greedy):
    for stem, found in hf_greedy.items():
        assert speech_recognition.word_error_rate(SPOKEN[stem], found["text"]) <= 0.3, (stem, found["text"])
    assert hf_greedy["library"]["text"] == SPOKEN["library"]


@pytest.mark.slow
def test_whisper_base_device_pte_keeps_the_stock_runtime_contract_and_gives_hf_greedy_ids(device_run, hf_greedy):
    assert_device_contract(device_run["path"])
    for stem, expected in hf_greedy.items():
        decoded = device_run[stem]["decoded"]
        assert decoded.ended and decoded.ids == expected["ids"], (stem, decoded.ids, expected["text"])


@pytest.mark.benchmark  # the host form in CI is the tiny Whisper's (test_the_export_command_verifies_a_tiny_whisper...)
def test_whisper_base_host_pte_gives_hf_greedy_ids_on_every_recording(whisper_base, device_run, hf_greedy, tmp_path_factory):
    """The host form's ``encoder`` is the device form's function (stateless, the same graph): it is run on one
    recording and must give the device form's output bit for bit; ``text_decoder`` (the caches as Core AI
    state) then decodes every recording from the encoder outputs the device form's run gave."""
    path = exported(whisper_base, "host", tmp_path_factory.mktemp("host"))
    program = speech_recognition.SpeechProgram(path)
    rules = speech_recognition.DecodingRules.read(path.parent)
    assert rules.prompt == (50258, 50259, 50359, 50363) and len(rules.suppress) == 88
    first = RECORDINGS[0].stem
    assert torch.equal(program.encoder(hf_greedy[first]["features"]), device_run[first]["cross"])
    for stem, expected in hf_greedy.items():
        decoded = speech_recognition.decode(program.text_decoder, device_run[stem]["cross"], rules, max_decode_len=program.max_decode_len)
        assert decoded.ended and decoded.ids == expected["ids"], (stem, decoded.ids, expected["text"])
        assert program.text(decoded.ids) == expected["text"]

    pte = read_pte(path)  # the weights stored once, and what the runner and an app need beside them
    weights = (whisper_base / "model.safetensors").stat().st_size  # fp32; the tied output projection is not saved
    assert pte.size <= 1.01 * weights, (pte.size, weights)
    assert len({d.manifest["hash"] for d in pte.coreai_delegates()}) == 1
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "generation_config.json", "model.pte", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"
    ]
    assert program.constant("get_eos_ids") == 50257 and program.constant("decoder_start_token_id") == 50258
    assert program.settings == speech_recognition.FeatureSettings(n_mels=80)
