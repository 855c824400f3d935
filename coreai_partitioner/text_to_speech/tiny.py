"""The tiny random text-to-speech models (``--config vits``, ``--config kokoro``).

- ``vits``: a ``VitsModel`` of two layers, a stochastic duration predictor, MMS-TTS's shape of everything else at a
  few channels;
- ``kokoro``: a ``KModel`` of one layer and a two-layer ALBERT; its decoder keeps the widths ``KModel`` fixes (1024
  channels, 512 text channels, a 256-wide voice), the vocoder two small upsamplings.
"""

from __future__ import annotations

from typing import Any

#: ``--config`` names of the tiny random text-to-speech models.
NAMES = ("vits", "kokoro")

#: The tiny Kokoro's ``config.json``: a vocabulary of ten phonemes, Kokoro-82M's fixed widths, small elsewhere.
KOKORO = {
    "vocab": {phoneme: index + 1 for index, phoneme in enumerate("abcdefghij")}, "n_token": 12,
    "plbert": {
        "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32,
        "num_hidden_layers": 2, "dropout": 0.1,
    },
    "hidden_dim": 512, "style_dim": 128, "n_layer": 1, "max_dur": 8, "dropout": 0.2, "text_encoder_kernel_size": 5,
    "n_mels": 80,
    "istftnet": {
        "upsample_kernel_sizes": [4, 4], "upsample_rates": [2, 2], "gen_istft_hop_size": 2, "gen_istft_n_fft": 4,
        "resblock_dilation_sizes": [[1, 3, 5]], "resblock_kernel_sizes": [3], "upsample_initial_channel": 512,
    },
}


def tiny_config(name: str = "vits") -> Any:
    if name not in NAMES:
        raise ValueError(f"no tiny text-to-speech config {name!r}; choose one of {', '.join(NAMES)}")
    if name == "kokoro":
        from coreai_partitioner.text_to_speech.kokoro import KokoroConfig

        return KokoroConfig(KOKORO)
    from transformers import VitsConfig

    return VitsConfig(
        vocab_size=12, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, window_size=2, ffn_dim=8,
        flow_size=4, spectrogram_bins=5, upsample_initial_channel=8, upsample_rates=[2, 2], upsample_kernel_sizes=[4, 4],
        resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1]], prior_encoder_num_flows=2,
        prior_encoder_num_wavenet_layers=1, posterior_encoder_num_wavenet_layers=1, duration_predictor_num_flows=2,
        duration_predictor_filter_channels=8, depth_separable_num_layers=1, duration_predictor_flow_bins=2,
        sampling_rate=16000, architectures=["VitsModel"],
    )


def tiny_model(config: Any) -> Any:
    """The seeded tiny model of ``config`` in fp32 (neither family has an auto class to make it from a config)."""
    import torch

    torch.manual_seed(0)
    if getattr(config, "model_type", None) == "kokoro":
        import tempfile
        from pathlib import Path

        from coreai_partitioner.text_to_speech.kokoro import load_model

        with tempfile.TemporaryDirectory() as directory:  # KModel always loads a weights file: none of its weights
            weights = Path(directory) / "random.pth"
            torch.save({}, weights)
            return load_model(config, weights)
    from transformers import VitsModel

    return VitsModel(config).eval()
