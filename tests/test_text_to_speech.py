"""Text-to-speech: transformers' VitsModel as ``durations`` and ``decoder`` in one ``.pte``, run by the package's loop
through ExecuTorch's runtime, against VitsModel's own forward at the same seed."""

from __future__ import annotations

import pytest
import torch
from requires import require

pytestmark = pytest.mark.slow


def tiny_vits(**overrides):
    """The package's tiny VITS (``--config vits``: two conv flows, so the spline runs), ``overrides`` on its config."""
    require("transformers", "hf")
    from coreai_partitioner.text_to_speech.tiny import tiny_config, tiny_model

    config = tiny_config()
    for key, value in overrides.items():
        setattr(config, key, value)
    return tiny_model(config)


def reference(model, ids: list[int], seed: int):
    """VitsModel.forward's waveform and per-token durations at ``seed`` (its two noises drawn inside)."""
    from coreai_partitioner.text_to_speech.families.vits import reference

    return reference(model, ids, seed)


@pytest.mark.parametrize("stochastic", [True, False], ids=["stochastic-durations", "deterministic-durations"])
def test_vits_pte_gives_vits_durations_and_waveform_at_the_same_seed(tmp_path, stochastic):
    from coreai_partitioner import save_pte
    from coreai_partitioner.text_to_speech import SpeechProgram
    from coreai_partitioner.text_to_speech.families.vits import lower_vits, synthesize
    from coreai_partitioner.text_to_speech.families.vits import _durations_call
    from coreai_partitioner.verify.describe import outside_delegates

    model = tiny_vits(use_stochastic_duration_prediction=stochastic)
    edge = lower_vits(model, max_tokens=12, max_frames=128)
    # each method one delegate; outside, only the int64 ids and mask cast to int32 for it
    assert outside_delegates(edge) == {"durations": {"aten._to_copy.default": 2}, "decoder": {}}
    for method in ("durations", "decoder"):
        delegates = [n for n in edge.exported_program(method).graph.nodes if "call_delegate" in str(n.target)]
        assert len(delegates) == 1, method
    program = SpeechProgram(save_pte(edge, tmp_path / "vits.pte"))
    for ids, seed in (([1, 5, 2, 7, 3, 4], 3), ([4, 1, 1, 9, 2, 6, 11, 3, 5], 7)):
        expected, expected_durations = reference(model, ids, seed)
        durations = _durations_call(program, torch.tensor([ids]), seed)[0][0]  # padded to 12
        assert torch.equal(durations[: len(ids)], expected_durations) and not durations[len(ids) :].any()
        waveform = synthesize(program, ids, seed=seed)
        assert waveform.shape == expected.shape
        snr = 10 * torch.log10(expected.pow(2).sum() / (expected - waveform).pow(2).sum())
        assert snr >= 40, f"{snr:.1f} dB"


def test_the_device_form_keeps_upstreams_contract_and_gives_vits_durations_and_waveform(tmp_path):
    from coreai_partitioner import save_pte
    from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte
    from coreai_partitioner.text_to_speech import SpeechProgram
    from coreai_partitioner.text_to_speech.families.vits import lower_vits, synthesize
    from coreai_partitioner.text_to_speech.families.vits import durations_of
    from coreai_partitioner.verify.describe import outside_delegates

    model = tiny_vits()
    edge = lower_vits(model, max_tokens=12, max_frames=128, device=True)  # checks every delegate's inputs and outputs
    # outside: the int64 ids and mask cast to fp32 (through int32), what upstream's runtime passes a delegate
    assert outside_delegates(edge) == {"durations": {"aten._to_copy.default": 4}, "decoder": {}}
    pte = save_pte(edge, tmp_path / "vits.pte")
    contents = read_pte(pte)
    assert {d.backend_id for method in contents.methods for d in contents.coreai_delegates(method)} == {"CoreAIBackend"}
    program = SpeechProgram(pte)
    ids = [1, 5, 2, 7, 3, 4]
    expected, expected_durations = reference(model, ids, 3)
    assert torch.equal(durations_of(program, ids, seed=3), expected_durations)
    waveform = synthesize(program, ids, seed=3)
    assert waveform.shape == expected.shape
    assert 10 * torch.log10(expected.pow(2).sum() / (expected - waveform).pow(2).sum()) >= 40


def test_a_multi_speaker_vits_is_refused_naming_num_speakers_before_export():
    from coreai_partitioner.text_to_speech.families.vits import UnsupportedVits, lower_vits

    model = tiny_vits()
    model.config.num_speakers = 2
    with pytest.raises(UnsupportedVits, match="num_speakers=2"):
        lower_vits(model)


def test_too_many_frames_for_the_pte_is_refused_naming_max_frames(tmp_path):
    from coreai_partitioner import save_pte
    from coreai_partitioner.text_to_speech import SpeechProgram
    from coreai_partitioner.text_to_speech.families.vits import lower_vits, synthesize

    program = SpeechProgram(save_pte(lower_vits(tiny_vits(), max_tokens=12, max_frames=5), tmp_path / "vits.pte"))
    with pytest.raises(ValueError, match="--max-frames"):
        synthesize(program, [1, 5, 2, 7, 3, 4, 9, 9, 2], seed=3)
    with pytest.raises(ValueError, match="--max-tokens"):
        synthesize(program, list(range(12)) + [1], seed=3)


def test_export_writes_a_pte_that_generate_speech_turns_into_vits_waveform_as_a_wav(tmp_path):
    """The command line: ``export --config vits --verify`` (detected by the config's VitsModel head), then
    ``generate-speech`` writes a 16-bit WAV at the model's sampling rate holding VitsModel's waveform at that seed."""
    import wave

    from coreai_partitioner.cli.main import main

    pte, wav = tmp_path / "model.pte", tmp_path / "speech.wav"
    assert main(["export", "--config", "vits", "--verify", "--max-tokens", "12", "--max-frames", "128", "--out", str(pte)]) == 0
    ids = [1, 5, 2, 7, 3, 4]
    assert main(["generate-speech", str(pte), "--ids", ",".join(map(str, ids)), "--seed", "3", "--out", str(wav)]) == 0
    expected, _ = reference(tiny_vits(), ids, 3)
    with wave.open(str(wav)) as file:
        assert (file.getframerate(), file.getnchannels(), file.getsampwidth()) == (16000, 1, 2)
        written = torch.frombuffer(bytearray(file.readframes(file.getnframes())), dtype=torch.int16)
    pcm = (expected.clamp(-1, 1) * 32767).round()
    assert written.shape == pcm.shape and (written.float() - pcm).abs().max() <= 2  # the runtime's last bit, at most


def test_text_to_speech_refuses_fp16_and_a_multi_speaker_checkpoint_naming_the_flag_and_field(tmp_path, capsys):
    from coreai_partitioner.cli.main import main

    with pytest.raises(SystemExit):
        main(["export", "--config", "vits", "--dtype", "fp16", "--out", str(tmp_path / "m.pte")])
    assert "--dtype fp16: text-to-speech exports fp32" in capsys.readouterr().err
    config = tiny_vits().config
    config.num_speakers, config.speaker_embedding_size = 2, 4
    config.save_pretrained(tmp_path / "ckpt")
    with pytest.raises(SystemExit):
        main(["export", "--checkpoint", str(tmp_path / "ckpt"), "--dry-run", "--out", str(tmp_path / "m.pte")])
    assert "num_speakers=2" in capsys.readouterr().err


def test_a_dry_run_names_both_methods_and_their_limits_without_lowering(tmp_path, capsys):
    from coreai_partitioner.cli.main import main

    assert main(["export", "--config", "vits", "--dry-run", "--max-tokens", "32", "--out", str(tmp_path / "m.pte")]) == 0
    said = capsys.readouterr().out
    assert "durations(input_ids [1, 32]" in said and "F <= 4096" in said and not (tmp_path / "m.pte").exists()


def test_a_third_family_registered_from_outside_the_package_exports_verifies_and_speaks(tmp_path):
    """A family is one module (here ``tests/toy_speech_family.py``): registered, the export command finds its tiny
    config, lowers and verifies it, and ``generate-speech`` runs its loop by the ``get_family`` the .pte carries."""
    import toy_speech_family as toy

    from coreai_partitioner.cli.main import main
    from coreai_partitioner.text_to_speech import SpeechProgram, families

    families.register(toy)
    try:
        pte, wav = tmp_path / "toy.pte", tmp_path / "toy.wav"
        assert main(["export", "--config", "toy-speech", "--verify", "--out", str(pte)]) == 0
        assert SpeechProgram(pte).family == "toy-speech"
        assert main(["generate-speech", str(pte), "--ids", "1,2,3", "--out", str(wav)]) == 0
        assert wav.stat().st_size > 44
    finally:
        families.unregister(toy.NAME)
    assert "toy-speech" not in families.names()
