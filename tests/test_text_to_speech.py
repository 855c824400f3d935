"""Text-to-speech: transformers' VitsModel as ``durations`` and ``decoder`` in one ``.pte``, run by the package's loop
through ExecuTorch's runtime, against VitsModel's own forward at the same seed."""

from __future__ import annotations

import pytest
import torch
from requires import require

pytestmark = pytest.mark.slow


def tiny_vits(**overrides):
    transformers = require("transformers", "hf")
    config = transformers.VitsConfig(
        vocab_size=12, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, window_size=2, ffn_dim=8,
        flow_size=4, spectrogram_bins=5, upsample_initial_channel=8, upsample_rates=[2], upsample_kernel_sizes=[4],
        resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1]], prior_encoder_num_flows=1,
        prior_encoder_num_wavenet_layers=1, posterior_encoder_num_wavenet_layers=1, duration_predictor_num_flows=1,
        duration_predictor_filter_channels=8, depth_separable_num_layers=1, duration_predictor_flow_bins=2,
        **overrides,
    )
    torch.manual_seed(0)
    return transformers.VitsModel(config).eval()


def reference(model, ids: list[int], seed: int):
    """VitsModel.forward's waveform and per-token durations at ``seed`` (its two noises drawn inside)."""
    from transformers import set_seed

    durations = []
    hook = model.duration_predictor.register_forward_hook(lambda module, args, out: durations.append(out))
    try:
        with torch.no_grad():
            set_seed(seed)
            waveform = model(torch.tensor([ids])).waveform[0]
    finally:
        hook.remove()
    log_duration = durations[0]
    return waveform, torch.ceil(torch.exp(log_duration) / model.speaking_rate)[0, 0]


@pytest.mark.parametrize("stochastic", [True, False], ids=["stochastic-durations", "deterministic-durations"])
def test_vits_pte_gives_vits_durations_and_waveform_at_the_same_seed(tmp_path, stochastic):
    from coreai_partitioner import save_pte
    from coreai_partitioner.text_to_speech import VitsProgram, lower_vits, synthesize
    from coreai_partitioner.verify.describe import outside_delegates

    model = tiny_vits(use_stochastic_duration_prediction=stochastic)
    edge = lower_vits(model, max_tokens=12, max_frames=128)
    # each method one delegate; outside, only the int64 ids and mask cast to int32 for it
    assert outside_delegates(edge) == {"durations": {"aten._to_copy.default": 2}, "decoder": {}}
    for method in ("durations", "decoder"):
        delegates = [n for n in edge.exported_program(method).graph.nodes if "call_delegate" in str(n.target)]
        assert len(delegates) == 1, method
    program = VitsProgram(save_pte(edge, tmp_path / "vits.pte"))
    for ids, seed in (([1, 5, 2, 7, 3, 4], 3), ([4, 1, 1, 9, 2, 6, 11, 3, 5], 7)):
        expected, expected_durations = reference(model, ids, seed)
        padded = (0, 12 - len(ids))
        durations = program.run("durations", (
            torch.nn.functional.pad(torch.tensor([ids]), padded), torch.nn.functional.pad(torch.ones(1, len(ids), dtype=torch.long), padded),
            torch.nn.functional.pad(torch.manual_seed(seed) and torch.randn(1, 2, len(ids)) * stochastic, padded),
        ))[0][0]
        assert torch.equal(durations[: len(ids)], expected_durations) and not durations[len(ids) :].any()
        waveform = synthesize(program, ids, seed=seed)
        assert waveform.shape == expected.shape
        snr = 10 * torch.log10(expected.pow(2).sum() / (expected - waveform).pow(2).sum())
        assert snr >= 40, f"{snr:.1f} dB"


def test_a_multi_speaker_vits_is_refused_naming_num_speakers_before_export():
    from coreai_partitioner.text_to_speech import UnsupportedVits, lower_vits

    with pytest.raises(UnsupportedVits, match="num_speakers=2"):
        lower_vits(tiny_vits(num_speakers=2, speaker_embedding_size=4))


def test_too_many_frames_for_the_pte_is_refused_naming_max_frames(tmp_path):
    from coreai_partitioner import save_pte
    from coreai_partitioner.text_to_speech import VitsProgram, lower_vits, synthesize

    program = VitsProgram(save_pte(lower_vits(tiny_vits(), max_tokens=12, max_frames=5), tmp_path / "vits.pte"))
    with pytest.raises(ValueError, match="--max-frames"):
        synthesize(program, [1, 5, 2, 7, 3, 4], seed=3)
