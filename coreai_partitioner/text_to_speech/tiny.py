"""A tiny random ``VitsModel`` config (``--config vits``): two layers, a stochastic duration predictor, MMS-TTS's
shape of everything else at a few channels."""

from __future__ import annotations

from typing import Any

#: ``--config`` names of the tiny random text-to-speech models.
NAMES = ("vits",)


def tiny_config(name: str = "vits") -> Any:
    from transformers import VitsConfig

    if name not in NAMES:
        raise ValueError(f"no tiny text-to-speech config {name!r}; choose one of {', '.join(NAMES)}")
    return VitsConfig(
        vocab_size=12, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, window_size=2, ffn_dim=8,
        flow_size=4, spectrogram_bins=5, upsample_initial_channel=8, upsample_rates=[2, 2], upsample_kernel_sizes=[4, 4],
        resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1]], prior_encoder_num_flows=2,
        prior_encoder_num_wavenet_layers=1, posterior_encoder_num_wavenet_layers=1, duration_predictor_num_flows=2,
        duration_predictor_filter_channels=8, depth_separable_num_layers=1, duration_predictor_flow_bins=2,
        sampling_rate=16000, architectures=["VitsModel"],
    )


def tiny_model(config: Any) -> Any:
    """The seeded tiny model of ``config`` in fp32 (``VitsModel`` has no auto class to make it from a config)."""
    import torch
    from transformers import VitsModel

    torch.manual_seed(0)
    return VitsModel(config).eval()
