"""Audio-language models (``coreai_partitioner.audio_text_to_text``): one ``.pte`` that ExecuTorch's ``MultimodalRunner`` runs.

Voxtral's tiny random model (a 2-layer, 16-wide encoder over Voxtral's own
128-bin 30 s window, a 2-layer Llama decoder) gets a real recording (the
speech tests' fox and kitchen recordings back to back, 7.0 s) and a text
prompt in Voxtral's chat layout; the ``.pte`` runs in ExecuTorch's own
``MultimodalRunner`` (the Python binding of the 1.5.1 wheel, Core AI
delegates on the host backend), one ``make_audio_input`` a window, and its
32 greedy tokens are HF ``generate``'s.  A recording of two windows (34 s)
too.  The features are checked against HF's feature extractor, as
``VoxtralProcessor`` computes and cuts them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from requires import require  # noqa: E402

require("transformers", "hf")

from coreai_partitioner import audio_text_to_text, save_pte, text_generation  # noqa: E402
from coreai_partitioner.audio_text_to_text import run  # noqa: E402
from coreai_partitioner.speech_recognition.features import FeatureSettings, log_mel, log_mel_windows, read_wav  # noqa: E402

SPEECH = Path(__file__).parent / "speech"
RECORDINGS = ("fox.wav", "kitchen.wav", "library.wav")
NEW_TOKENS = 32
PROMPT = "What is said?"
#: Two windows of 375 embeddings and a prompt; a window in one text_decoder call.
SHAPES = text_generation.DecoderShapes(max_context_len=800, prefill_chunk=375)
FORMS = {"host": SHAPES, "device": text_generation.DecoderShapes(max_context_len=800, prefill_chunk=375, target="device")}
#: The largest difference allowed between this package's log-mel and HF's WhisperFeatureExtractor (128 bins) on the
#: speech tests' recordings and a recording of two windows: measured 0.0 (the same float32 arithmetic, bit for bit).
FEATURES_ATOL = 1e-5


def recording(seconds_apart: float = 0.0) -> np.ndarray:
    """fox.wav then kitchen.wav (7.0 s), ``seconds_apart`` of silence between them."""
    gap = np.zeros(int(16000 * seconds_apart), dtype=np.float32)
    return np.concatenate([read_wav(SPEECH / "fox.wav"), gap, read_wav(SPEECH / "kitchen.wav")])


def processor_features(extractor, audio: np.ndarray) -> torch.Tensor:
    """``input_features`` as ``VoxtralProcessor._retrieve_input_features`` makes them: the recording padded to whole
    30 s windows, one spectrogram, cut into windows ``[windows, bins, 3000]``."""
    features = extractor(
        audio, sampling_rate=16000, return_tensors="pt", padding=True, pad_to_multiple_of=480000, truncation=False
    )["input_features"]
    return features.reshape(extractor.feature_size, -1, 3000).transpose(0, 1)


def tiny_voxtral():
    import transformers

    config = audio_text_to_text.tiny_config("voxtral")
    torch.manual_seed(0)
    return transformers.VoxtralForConditionalGeneration(config).eval()


class Prompt:
    """A recording and :data:`PROMPT` as Voxtral's processor lays them out, and HF's greedy tokens over them."""

    def __init__(self, model, audio: np.ndarray) -> None:
        family = audio_text_to_text.family_of(model.config)
        extractor, self.tokenizer = family.tiny_processor(model.config)
        self.features = processor_features(extractor, audio)
        self.ids = family.prompt_ids(self.tokenizer, model.config, self.features.shape[0], PROMPT)
        self.segments = run.runner_inputs([self.ids], self.features, model.config.audio_token_id, family.audio_tokens(model.config))
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.tensor([self.ids]), input_features=self.features, max_new_tokens=NEW_TOKENS,
                do_sample=False, pad_token_id=0,
            )
        self.hf_tokens = out[0, len(self.ids) :].tolist()


_EXPORTS: dict[str, tuple] = {}


def exported(form: str, tmp_path_factory):
    """The tiny Voxtral's ``.pte`` in ``form`` and its tokenizer, exported once."""
    if form not in _EXPORTS:
        model = tiny_voxtral()
        directory = tmp_path_factory.mktemp(f"voxtral-{form}")
        path = save_pte(audio_text_to_text.lower_audio_language(model, FORMS[form]), directory / "model.pte")
        _, tokenizer = audio_text_to_text.family_of(model.config).tiny_processor(model.config)
        tokenizer.backend_tokenizer.save(str(directory / "tokenizer.json"))
        _EXPORTS[form] = (model, path, directory / "tokenizer.json", tokenizer)
    return _EXPORTS[form]


def runner_tokens(path, tokenizer_path, tokenizer, prompt: Prompt) -> list[int]:
    vocab = tokenizer.get_vocab()
    return [vocab[piece] for piece in run.generate(path, tokenizer_path, prompt.segments, NEW_TOKENS)]


# ---------------------------------------------------------------- features, no export


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_log_mel_an_app_ports_is_the_processors_input_features_on_real_recordings(name):
    from transformers import WhisperFeatureExtractor

    audio = read_wav(SPEECH / name)
    expected = processor_features(WhisperFeatureExtractor(feature_size=128), audio)
    ours = log_mel(audio, FeatureSettings(n_mels=128))
    assert expected.shape == (1, 128, 3000) and ours.shape == expected.shape
    assert (ours - expected).abs().max().item() < FEATURES_ATOL


def test_the_log_mel_of_a_recording_of_two_windows_is_the_processors_cut_as_it_cuts_it():
    from transformers import WhisperFeatureExtractor

    audio = recording(seconds_apart=27.0)
    expected = processor_features(WhisperFeatureExtractor(feature_size=128), audio)
    ours = log_mel_windows(audio, FeatureSettings(n_mels=128))
    assert expected.shape == (2, 128, 3000) and ours.shape == expected.shape
    assert (ours - expected).abs().max().item() < FEATURES_ATOL


@pytest.mark.slow  # HF's encoder over whole 30 s windows, and generate
def test_a_recording_of_two_windows_is_two_runner_audio_inputs_in_order_and_the_model_sees_them_concatenated():
    model = tiny_voxtral()
    prompt = Prompt(model, recording(seconds_apart=27.0))
    audio = [s for s in prompt.segments if s.is_audio]
    assert prompt.features.shape == (2, 128, 3000) and len(audio) == 2
    assert all(torch.equal(s.features, w) for s, w in zip(audio, prompt.features))
    alm = audio_text_to_text.adapt(model, SHAPES)
    with torch.no_grad():
        ours = torch.cat([alm.audio_encoder(s.encoder_input()) for s in audio], dim=1)[0]
        hf = model.get_audio_features(prompt.features).pooler_output
    torch.testing.assert_close(ours, hf, rtol=1e-5, atol=1e-5)
    assert run.greedy(alm, prompt.segments, NEW_TOKENS, eos_ids=[2]) == prompt.hf_tokens


@pytest.mark.slow  # HF's encoder over whole 30 s windows, and generate
def test_the_eager_methods_fed_segment_by_segment_are_hf_eager_and_the_recording_matters():
    model = tiny_voxtral()
    alm = audio_text_to_text.adapt(model, SHAPES)
    prompt = Prompt(model, recording())
    assert run.greedy(alm, prompt.segments, NEW_TOKENS, eos_ids=[2]) == prompt.hf_tokens
    silent = Prompt(model, np.zeros(16000 * 7, dtype=np.float32))
    assert silent.hf_tokens != prompt.hf_tokens  # the audio reaches the answer


# ---------------------------------------------------------------- refusals, from the config alone


def test_an_audio_model_whose_encoder_is_not_lowered_is_refused_before_any_weights_naming_what_is_missing():
    from transformers import GraniteSpeechConfig

    with pytest.raises(audio_text_to_text.UnsupportedAudioModel, match="granite_speech: .*conformer encoder"):
        audio_text_to_text.check_config(GraniteSpeechConfig(), SHAPES)


def test_an_audio_model_whose_decoder_no_family_lowers_is_refused_naming_the_decoder():
    config = audio_text_to_text.tiny_config("voxtral")
    config.text_config.model_type = "bloom"
    with pytest.raises(text_generation.UnsupportedModel, match="bloom"):
        audio_text_to_text.check_config(config, SHAPES)


def test_a_checkpoint_without_an_audio_config_is_refused_naming_it():
    from transformers import LlamaConfig

    with pytest.raises(audio_text_to_text.UnsupportedAudioModel, match="no audio_config"):
        audio_text_to_text.check_config(LlamaConfig(), SHAPES)


def test_a_window_of_more_embeddings_than_one_decoder_call_takes_is_refused_with_the_bound_to_give():
    config = audio_text_to_text.tiny_config("voxtral")
    shapes = text_generation.DecoderShapes(max_context_len=800, prefill_chunk=128)
    with pytest.raises(audio_text_to_text.AudioTokensOverBound, match="--prefill-chunk 375"):
        audio_text_to_text.check_config(config, shapes)


def test_the_command_detects_an_audio_language_checkpoint_from_its_config():
    from transformers import GraniteSpeechConfig

    from coreai_partitioner.cli.detect import task_of

    config = audio_text_to_text.tiny_config("voxtral")
    config.architectures = ["VoxtralForConditionalGeneration"]
    assert task_of(config.to_dict()) == "audio-text-to-text"
    granite = GraniteSpeechConfig(architectures=["GraniteSpeechForConditionalGeneration"])
    assert task_of(granite.to_dict()) == "audio-text-to-text"  # and refused there, naming its encoder


@pytest.mark.slow  # a fresh interpreter imports the package
def test_the_command_refuses_granite_speech_naming_its_encoder_before_loading_weights(tmp_path):
    import subprocess
    import sys

    from transformers import GraniteSpeechConfig

    GraniteSpeechConfig(architectures=["GraniteSpeechForConditionalGeneration"]).save_pretrained(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "coreai_partitioner", "export", "--checkpoint", str(tmp_path), "--dry-run"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode != 0 and "granite_speech" in done.stderr and "conformer encoder" in done.stderr
    assert not list(tmp_path.glob("*.pte"))


# ---------------------------------------------------------------- through ExecuTorch's MultimodalRunner


@pytest.mark.slow
@pytest.mark.parametrize("form", sorted(FORMS))
def test_multimodal_runner_on_the_pte_generates_hf_greedy_tokens_for_a_real_recording(form, tmp_path_factory):
    model, path, tokenizer_path, tokenizer = exported(form, tmp_path_factory)
    prompt = Prompt(model, recording())
    assert len(prompt.hf_tokens) == NEW_TOKENS
    assert runner_tokens(path, tokenizer_path, tokenizer, prompt) == prompt.hf_tokens


@pytest.mark.slow
@pytest.mark.parametrize("form", sorted(FORMS))
def test_multimodal_runner_on_a_recording_of_two_windows_generates_hf_greedy_tokens(form, tmp_path_factory):
    model, path, tokenizer_path, tokenizer = exported(form, tmp_path_factory)
    prompt = Prompt(model, recording(seconds_apart=27.0))
    assert sum(s.is_audio for s in prompt.segments) == 2
    assert runner_tokens(path, tokenizer_path, tokenizer, prompt) == prompt.hf_tokens


@pytest.mark.slow
@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_method_is_one_core_ai_delegate_of_one_asset(form, tmp_path_factory):
    from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte

    _, path, _, _ = exported(form, tmp_path_factory)
    pte = read_pte(path)
    delegates = pte.coreai_delegates()
    assert sorted(d.method for d in delegates) == sorted(audio_text_to_text.METHODS)
    assert len({d.manifest["hash"] for d in delegates}) == 1


#: fp16 against fp32, SNR in dB of the tiny model's audio embeddings and logits after the prompt (7.0 s recording):
#: measured 53.5 and 51.8 dB (fp16's 11-bit mantissa bounds one rounding near 70 dB; a few layers' roundings add up).
FP16_SNR_DB = 45.0


@pytest.mark.slow
def test_the_fp16_pte_is_judged_by_snr_against_the_fp32_model(tmp_path):
    from coreai_partitioner.text_decoder.multimodal import Methods, prefill
    from coreai_partitioner.verify.fidelity import centered, snr_psnr

    model = tiny_voxtral()
    prompt = Prompt(model, recording())
    fp32 = Methods.of(audio_text_to_text.adapt(model, SHAPES))
    half = tiny_voxtral().to(torch.float16)
    path = save_pte(audio_text_to_text.lower_audio_language(half, SHAPES), tmp_path / "model.pte")
    pte = Methods.of(path)
    window = prompt.segments[1].encoder_input()
    audio_snr, _ = snr_psnr(pte.call("audio_encoder", window).float(), fp32.call("audio_encoder", window))
    logits = []
    for methods in (pte, fp32):
        methods.reset()
        position = 0
        for segment in prompt.segments:
            last, position = prefill(methods, segment, position)
        logits.append(last.float())
    logits_snr, _ = snr_psnr(centered(logits[0]), centered(logits[1]))
    print(f"fp16 against fp32: audio embeddings {audio_snr:.1f} dB, logits after the prompt {logits_snr:.1f} dB")
    assert audio_snr > FP16_SNR_DB and logits_snr > FP16_SNR_DB


@pytest.mark.slow
def test_optimum_executorchs_multimodal_model_exports_voxtral_with_the_coreai_recipe_and_generates_hf_greedy_tokens():
    """``ExecuTorchModelForMultiModalToText.from_pretrained(dir, recipe="coreai", task="multimodal-text-to-text")``
    on transformers 5.0.0rc1, a real recording's features (one window)."""
    from test_transformers_rc1 import rc1_report

    result = rc1_report("optimum_voxtral.py")
    assert result["transformers"] == "5.0.0rc1"
    assert {"audio_encoder", "token_embedding", "text_decoder", "modality", "audio_token_id", "get_eos_id"} <= set(result["methods"])
    assert len(result["hf"]) == NEW_TOKENS and result["optimum"] == result["hf"]


@pytest.mark.slow
def test_the_command_exports_a_tiny_voxtral_verifies_it_and_answers_about_a_recording_through_multimodal_runner(tmp_path):
    import subprocess
    import sys
    import wave

    path = tmp_path / "talk.wav"
    with wave.open(str(path), "wb") as file:
        file.setnchannels(1), file.setsampwidth(2), file.setframerate(16000)
        file.writeframes((recording(seconds_apart=27.0) * 32767).astype("<i2").tobytes())
    out = tmp_path / "out" / "model.pte"
    done = subprocess.run(
        [sys.executable, "-m", "coreai_partitioner", "export", "--config", "voxtral", "--audio", str(path), "--prompt",
         PROMPT, "--verify", "--out", str(out)],
        capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "\n  same" in done.stdout and "talk.wav (2 window(s)), 'What is said?' -> '" in done.stdout
    assert {p.name for p in out.parent.iterdir()} == {"model.pte", "tokenizer.json", "preprocessor_config.json"}
