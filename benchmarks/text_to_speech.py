"""Text-to-speech export and runtime: VITS (MMS-TTS's shape) and Kokoro (Kokoro-82M's shape), random weights, each to
a .pte of ``durations`` and ``decoder``.

    python benchmarks/text_to_speech.py                        # every row; writes benchmarks/results/text_to_speech.*
    python benchmarks/text_to_speech.py --rows vits-tiny kokoro-tiny

Each row is one process: build the model (``VitsConfig()``'s defaults are
MMS-TTS's shape: 6 text-encoder layers of 192, 4 spline flows in the
stochastic duration predictor, HiFi-GAN with a hop of 256 at 16 kHz;
:data:`KOKORO_82M` is Kokoro-82M's ``config.json``: a 12-layer ALBERT of 768,
3 LSTM layers of 512, the iSTFTNet vocoder at 24 kHz; random weights, as no
trained model of either is in the registry), lower it
(``text_to_speech.families.vits.lower_vits``, ``text_to_speech.families.kokoro.lower_kokoro``),
write the ``.pte``, then run the package's loop (``synthesize``; Kokoro's in
a seeded random voice) on seeded random ids in ExecuTorch's runtime: the
median of ``--runs`` runs after one warm-up, against the model itself at the
same seed (SNR).  "x real time" is the runtime's seconds over the audio's
seconds.  The Core AI delegates run on coreai-core's Linux CPU runtime on
this 2-core machine, not on a device.  A random Kokoro predicts about 25
frames an id (Kokoro-82M's trained one about 3 to 6), so its rows speak few ids.
"""

from __future__ import annotations

import resource
import statistics
import tempfile
import time
from pathlib import Path

import row_benchmark

#: row -> (config: "tiny", VitsConfig overrides or a Kokoro config.json, token ids per run, max tokens, max frames)
ROWS = {
    "vits-tiny": ("tiny", 12, 16, 512),
    "vits-mms-shape": ({}, 48, 64, 2048),
    "kokoro-tiny": ("kokoro", 6, 16, 96),
    "kokoro-82m-shape": ("kokoro-82m", 10, 32, 512),
}

#: Kokoro-82M's config.json (hexgrad/Kokoro-82M), its vocabulary 178 ids whatever their phonemes.
KOKORO_82M = {
    "vocab": {chr(0x100 + index): index for index in range(1, 178)}, "n_token": 178,
    "plbert": {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 2048,
               "max_position_embeddings": 512, "num_hidden_layers": 12, "dropout": 0.1},
    "hidden_dim": 512, "style_dim": 128, "n_layer": 3, "max_dur": 50, "dropout": 0.2, "text_encoder_kernel_size": 5,
    "n_mels": 80, "dim_in": 64, "max_conv_dim": 512, "multispeaker": True,
    "istftnet": {"upsample_kernel_sizes": [20, 12], "upsample_rates": [10, 6], "gen_istft_hop_size": 5,
                 "gen_istft_n_fft": 20, "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
                 "resblock_kernel_sizes": [3, 7, 11], "upsample_initial_channel": 512},
}
COLUMNS = ("row", "lower s", "write s", "peak RSS GB", ".pte MB", "weights MB", "tokens", "audio s", "run s",
           "x real time", "SNR dB")


def worker(name: str, runs: int) -> dict:
    import torch

    from coreai_partitioner import save_pte
    from coreai_partitioner.text_to_speech import SpeechProgram
    from coreai_partitioner.text_to_speech.families import kokoro, vits
    from coreai_partitioner.text_to_speech.tiny import tiny_config, tiny_model
    from coreai_partitioner.verify.fidelity import snr_psnr

    setting, count, max_tokens, max_frames = ROWS[name]
    if setting == "tiny":
        config = tiny_config("vits")
    elif setting == "kokoro":
        config = tiny_config("kokoro")
    elif setting == "kokoro-82m":
        config = kokoro.KokoroConfig(KOKORO_82M)
    else:
        from transformers import VitsConfig

        config = VitsConfig(**setting)
    model = tiny_model(config)  # seeded, random weights
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    generator = torch.Generator().manual_seed(1)
    if config.model_type == "kokoro":
        ids = torch.randint(1, config.n_token, (count,), generator=generator).tolist()
        style = torch.randn(1, 256, generator=generator)
        expected, _ = kokoro.reference(model, ids, style, seed=0)
        lower = kokoro.lower_kokoro

        def speak(program):
            return kokoro.synthesize(program, ids, style, seed=0)
    else:
        ids = torch.randint(0, config.vocab_size, (count,), generator=generator).tolist()
        expected, _ = vits.reference(model, ids, seed=0)
        lower = vits.lower_vits

        def speak(program):
            return vits.synthesize(program, ids, seed=0)
    started = time.perf_counter()
    edge = lower(model, max_tokens=max_tokens, max_frames=max_frames)
    lowered = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        pte = save_pte(edge, Path(directory) / "speech.pte")
        written = time.perf_counter() - started
        size = pte.stat().st_size
        del edge
        program = SpeechProgram(pte)
        waveform = speak(program)  # warm-up
        seconds = []
        for _ in range(runs):
            started = time.perf_counter()
            waveform = speak(program)
            seconds.append(time.perf_counter() - started)
    audio = waveform.numel() / config.sampling_rate
    run = statistics.median(seconds)
    same = waveform.shape == expected.shape
    snr = snr_psnr(waveform, expected)[0] if same else float("nan")
    return {
        "row": name, "lower s": round(lowered, 1), "write s": round(written, 1),
        "peak RSS GB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        ".pte MB": round(size / 1e6, 1), "weights MB": round(weights / 1e6, 1), "tokens": count,
        "audio s": round(audio, 2), "run s": round(run, 2), "x real time": round(run / audio, 2), "SNR dB": round(snr, 1),
    }


if __name__ == "__main__":
    row_benchmark.main(__file__, __doc__, ROWS, COLUMNS, worker, "text_to_speech", "fp32, random weights")
