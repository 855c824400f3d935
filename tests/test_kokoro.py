"""Text-to-speech, Kokoro: the ``kokoro`` package's ``KModel`` as ``durations`` and ``decoder`` in one ``.pte``, run by
the package's loop through ExecuTorch's runtime, against ``KModel.forward_with_tokens`` at the same seed and voice."""

from __future__ import annotations

import importlib.util
import json
import os
import wave

import pytest
import torch
from requires import require

#: How README's test command installs Kokoro's model code (its G2P, misaki, is the app's: not installed).
INSTALL = "pip install --no-deps kokoro==0.9.4 (README's test command does)"


def kokoro_model_code() -> None:
    """Kokoro's model code importable (``kokoro`` without its ``__init__``'s G2P: the package loads it so)."""
    require("loguru", "test")
    require("transformers", "hf")
    if importlib.util.find_spec("kokoro") is None:
        message = f"the kokoro package is not installed: {INSTALL}"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI is set, so a missing dependency fails rather than skips", pytrace=False)
        pytest.skip(message)


def kokoro_checkpoint(directory, **overrides):
    """A Kokoro checkpoint directory as Kokoro-82M's is laid out (``config.json``, ``kokoro-v1_0.pth`` of
    ``{part: state_dict}``), of the package's tiny seeded model; the model."""
    from coreai_partitioner.text_to_speech.families.kokoro import TINY as KOKORO
    from coreai_partitioner.text_to_speech.tiny import tiny_config, tiny_model

    kokoro_model_code()
    model = tiny_model(tiny_config("kokoro"))
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({**KOKORO, **overrides}))
    parts = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")
    torch.save({part: getattr(model, part).state_dict() for part in parts}, directory / "kokoro-v1_0.pth")
    return model


def snr(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float(10 * torch.log10(expected.pow(2).sum() / (expected - actual).pow(2).sum()))


@pytest.mark.slow
def test_the_methods_in_eager_give_kmodels_durations_and_waveform_over_padded_ids():
    """What the program computes, before any lowering: the LSTMs unrolled over padding, the alignment over
    ``max_frames`` columns, the vocoder's transforms as convolutions, the noises drawn as ``KModel`` draws them."""
    from coreai_partitioner.text_to_speech import istftnet
    from coreai_partitioner.text_to_speech.families import kokoro
    from coreai_partitioner.text_to_speech.tiny import tiny_config, tiny_model

    kokoro_model_code()
    model = tiny_model(tiny_config("kokoro"))
    durations_method, frames_method = kokoro.Durations(model).eval(), kokoro.Frames(model, 64).eval()
    phonemes, style = [3, 5, 7, 2, 9], torch.randn(1, 256)
    expected, expected_durations = kokoro.reference(model, phonemes, style, seed=4)
    ids = kokoro._ids(phonemes)
    pad = (0, 12 - ids.shape[1])
    with torch.no_grad():
        durations, prosody, text = durations_method(
            torch.nn.functional.pad(ids, pad), torch.nn.functional.pad(torch.ones_like(ids), pad), style, torch.ones(1)
        )
        assert torch.equal(durations[0, : ids.shape[1]], expected_durations) and not durations[0, ids.shape[1] :].any()
        frames, harmonics = int(durations.sum()), frames_method.harmonics
        torch.manual_seed(4)
        phases = torch.rand(1, harmonics)
        noise = torch.randn_like(torch.empty(1, harmonics, frames * kokoro.samples_per_frame(model)).transpose(1, 2))
        waveform = frames_method(durations, prosody, text, style, phases, noise.reshape(1, frames, -1))[0]
    assert waveform.shape == expected.shape and snr(waveform, expected) >= 100
    # torch.stft and torch.istft, as istftnet.TorchSTFT calls them, in real arithmetic
    stft, signal = istftnet.Stft(20, 5, 20), torch.randn(1, 400)
    window = torch.hann_window(20)
    spectrum = torch.stft(signal, 20, 5, 20, window=window, return_complex=True)
    magnitude, phase = stft.transform(signal)
    assert torch.allclose(magnitude, spectrum.abs(), atol=1e-5)
    assert torch.allclose(torch.polar(magnitude, phase), spectrum, atol=1e-5)  # the phase, wherever it wraps
    inverse = torch.istft(spectrum.abs() * torch.exp(spectrum.angle() * 1j), 20, 5, 20, window=window)
    assert torch.allclose(stft.inverse(spectrum.abs(), spectrum.angle())[0, 0], inverse, atol=1e-5)


@pytest.mark.slow
def test_a_kokoro_checkpoint_exports_in_the_device_form_and_speaks_kmodels_waveform_in_its_voice(tmp_path, capsys):
    """``export --checkpoint`` on Kokoro's own layout (found by its config.json, no model_type), ``--target device
    --verify``, then ``generate-speech --voice``: KModel's durations, and its waveform at the same seed as a WAV."""
    from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte
    from coreai_partitioner.cli.main import main
    from coreai_partitioner.text_to_speech import SpeechProgram
    from coreai_partitioner.text_to_speech.families import kokoro

    model = kokoro_checkpoint(tmp_path / "Kokoro-82M")
    pte, wav, voice = tmp_path / "out" / "kokoro.pte", tmp_path / "speech.wav", tmp_path / "af_test.pt"
    argv = ["export", "--checkpoint", str(tmp_path / "Kokoro-82M"), "--target", "device", "--verify"]
    assert main([*argv, "--max-tokens", "12", "--max-frames", "64", "--out", str(pte)]) == 0
    said, warned = capsys.readouterr()
    assert "durations: 1 Core AI delegate(s)" in said and "decoder: 1 Core AI delegate(s)" in said
    assert "durations equal" in said and " ok" in said and "assigned during export" not in warned
    assert (pte.parent / "config.json").is_file()  # its vocab, for the app's phoneme ids
    contents = read_pte(pte)
    for method in ("durations", "decoder"):  # upstream's runtime: one delegate, nothing but it in the method
        assert [d.backend_id for d in contents.coreai_delegates(method)] == ["CoreAIBackend"]

    torch.manual_seed(9)
    torch.save(torch.randn(510, 1, 256), voice)  # a voice pack as Kokoro's: a style per phoneme count
    phonemes = [4, 1, 8, 8, 2, 6]
    style = kokoro.voice_style(voice, len(phonemes))
    assert torch.equal(style, torch.load(voice)[len(phonemes) - 1])
    expected, expected_durations = kokoro.reference(model, phonemes, style, seed=3)
    program = SpeechProgram(pte)
    assert program.family == "kokoro"
    assert torch.equal(kokoro.durations_of(program, phonemes, style), expected_durations)
    ids = ",".join(map(str, phonemes))
    assert main(["generate-speech", str(pte), "--ids", ids, "--voice", str(voice), "--seed", "3", "--out", str(wav)]) == 0
    with wave.open(str(wav)) as file:
        assert (file.getframerate(), file.getnchannels(), file.getsampwidth()) == (24000, 1, 2)
        written = torch.frombuffer(bytearray(file.readframes(file.getnframes())), dtype=torch.int16)
    pcm = (expected.clamp(-1, 1) * 32767).round()
    assert written.shape == pcm.shape and snr(written.float(), pcm) >= 40
    assert main(["generate-speech", str(pte), "--ids", ids, "--out", str(wav)]) == 2
    assert "is a Kokoro program: give its voice with --voice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--max-frames"):
        kokoro.synthesize(program, [1] * 10, style, speed=0.1)  # ten times longer: more frames than it decodes


def test_a_kokoro_checkpoint_it_cannot_take_is_refused_naming_the_field_or_file_before_any_weights(tmp_path, capsys):
    from coreai_partitioner.cli.main import main
    from coreai_partitioner.text_to_speech.families.kokoro import TINY as KOKORO

    for name, change, said in (
        ("style", {"style_dim": 64}, "style_dim=64; KModel splits its 256-wide voice at 128"),
        ("widths", {"hidden_dim": 256}, "hidden_dim=256; KModel's decoder reads 512"),
        ("no-weights", {}, "has no *.pth weights file"),
    ):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps({**KOKORO, **change}))
        if name != "no-weights":
            (directory / "kokoro-v1_0.pth").write_bytes(b"not read")
        with pytest.raises(SystemExit):
            main(["export", "--checkpoint", str(directory), "--out", str(tmp_path / "m.pte")])
        assert said in capsys.readouterr().err, name
        assert not (tmp_path / "m.pte").exists()
    (tmp_path / "style" / "config.json").write_text(json.dumps(KOKORO))
    with pytest.raises(SystemExit):
        main(["export", "--checkpoint", str(tmp_path / "style"), "--max-tokens", "40", "--out", str(tmp_path / "m.pte")])
    assert "Kokoro takes 3 to 32 tokens" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(tmp_path / "style"), "--dry-run", "--out", str(tmp_path / "m.pte")]) == 0
    assert "Kokoro (KModel): 1 layer(s)" in capsys.readouterr().out
