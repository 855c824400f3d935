"""Text-to-speech export and runtime: VITS (MMS-TTS's shape, random weights) to a .pte of ``durations`` and ``decoder``.

    python benchmarks/text_to_speech.py                        # every row; writes benchmarks/results/text_to_speech.*
    python benchmarks/text_to_speech.py --rows vits-tiny

Each row is one process: build the model (``VitsConfig()``'s defaults are
MMS-TTS's shape: 6 text-encoder layers of 192, 4 spline flows in the
stochastic duration predictor, HiFi-GAN with a hop of 256 at 16 kHz; random
weights, as no trained VITS is in the registry), lower it
(``text_to_speech.lower_vits``), write the ``.pte``, then run the package's
loop (``synthesize``) on seeded random ids in ExecuTorch's runtime: the
median of ``--runs`` runs after one warm-up, against ``VitsModel`` itself at
the same seed (SNR).  "x real time" is the runtime's seconds over the audio's
seconds.  The Core AI delegates run on coreai-core's Linux CPU runtime on
this 2-core machine, not on a device.
"""

from __future__ import annotations

import resource
import statistics
import tempfile
import time
from pathlib import Path

import row_benchmark

#: row -> (config overrides, token ids per run, max tokens, max frames)
ROWS = {
    "vits-tiny": ("tiny", 12, 16, 512),
    "vits-mms-shape": ({}, 48, 64, 2048),
}
COLUMNS = ("row", "lower s", "write s", "peak RSS GB", ".pte MB", "weights MB", "tokens", "audio s", "run s",
           "x real time", "SNR dB")


def worker(name: str, runs: int) -> dict:
    import torch
    from transformers import VitsConfig, VitsModel

    from coreai_partitioner import save_pte
    from coreai_partitioner.text_to_speech import VitsProgram, lower_vits, synthesize
    from coreai_partitioner.text_to_speech.tiny import tiny_config
    from coreai_partitioner.text_to_speech.vits import reference
    from coreai_partitioner.verify.fidelity import snr_psnr

    overrides, count, max_tokens, max_frames = ROWS[name]
    config = tiny_config() if overrides == "tiny" else VitsConfig(**overrides)
    torch.manual_seed(0)
    model = VitsModel(config).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = torch.randint(0, config.vocab_size, (count,), generator=torch.Generator().manual_seed(1)).tolist()
    expected, _ = reference(model, ids, seed=0)
    started = time.perf_counter()
    edge = lower_vits(model, max_tokens=max_tokens, max_frames=max_frames)
    lowered = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        pte = save_pte(edge, Path(directory) / "vits.pte")
        written = time.perf_counter() - started
        size = pte.stat().st_size
        del edge
        program = VitsProgram(pte)
        waveform = synthesize(program, ids, seed=0)  # warm-up
        seconds = []
        for _ in range(runs):
            started = time.perf_counter()
            waveform = synthesize(program, ids, seed=0)
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
