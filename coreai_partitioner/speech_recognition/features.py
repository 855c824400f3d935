"""What ``encoder`` takes: a 16 kHz recording as Whisper's log-mel spectrogram, computed as Hugging Face's
``WhisperFeatureExtractor`` computes it.

ExecuTorch's ASR runner leaves the spectrogram to its caller.  :func:`read_wav`
reads a PCM wav and refuses, before any work, one that is not what the model
was trained on (16 kHz, mono) or longer than its 30 s window;
:func:`log_mel` pads it to the window and computes the features: a
400-sample Hann STFT every 160 samples, the power spectrum through Slaney's
mel filter bank (:func:`mel_filters`, librosa's and HF's), ``log10`` clamped
at 1e-10, floored at 8 below the maximum, then ``(x + 4) / 4``.
:func:`log_mel_windows` does the same over a recording of any length, cut
into windows as ``VoxtralProcessor`` cuts it (an audio-language model's input).
:class:`FeatureSettings` are the numbers involved, read from and written to
HF's ``preprocessor_config.json``, which the export writes beside the ``.pte``.
"""

from __future__ import annotations

import json
import os
import wave
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

#: The file HF's feature extractors read and write.
SETTINGS_FILE = "preprocessor_config.json"


class AudioError(ValueError):
    """A recording the model cannot take as it is; names the file, what it is, and the fix."""


@dataclass(frozen=True)
class FeatureSettings:
    """Whisper's feature settings: ``n_mels`` bins of a ``n_fft`` STFT every ``hop_length`` samples of
    ``sampling_rate`` audio, over a window of ``chunk_length`` seconds."""

    n_mels: int = 80
    sampling_rate: int = 16000
    hop_length: int = 160
    n_fft: int = 400
    chunk_length: int = 30

    @property
    def n_samples(self) -> int:
        """Samples in one window (480,000 for 30 s at 16 kHz)."""
        return self.chunk_length * self.sampling_rate

    @property
    def n_frames(self) -> int:
        """Mel frames in one window: what ``encoder`` takes (3,000)."""
        return self.n_samples // self.hop_length

    @classmethod
    def read(cls, directory: str | os.PathLike, n_mels: int | None = None) -> FeatureSettings:
        """The settings in ``directory``'s ``preprocessor_config.json`` (HF's keys); Whisper's defaults, with
        ``n_mels`` bins, when there is none."""
        path = Path(directory) / SETTINGS_FILE
        if not path.is_file():
            return cls() if n_mels is None else cls(n_mels=n_mels)
        saved = json.loads(path.read_text())
        return cls(
            n_mels=int(saved.get("feature_size", n_mels or cls.n_mels)),
            sampling_rate=int(saved.get("sampling_rate", cls.sampling_rate)),
            hop_length=int(saved.get("hop_length", cls.hop_length)),
            n_fft=int(saved.get("n_fft", cls.n_fft)),
            chunk_length=int(saved.get("chunk_length", cls.chunk_length)),
        )

    def write(self, directory: str | os.PathLike) -> Path:
        """``preprocessor_config.json`` in ``directory``, as HF's ``WhisperFeatureExtractor`` writes and reads it."""
        path = Path(directory) / SETTINGS_FILE
        settings = asdict(self)
        settings["feature_size"] = settings.pop("n_mels")
        path.write_text(
            json.dumps(
                {
                    "feature_extractor_type": "WhisperFeatureExtractor",
                    **settings,
                    "n_samples": self.n_samples,
                    "nb_max_frames": self.n_frames,
                    "padding_side": "right",
                    "padding_value": 0.0,
                    "return_attention_mask": False,
                },
                indent=2,
            )
            + "\n"
        )
        return path


def read_wav(path: str | os.PathLike, settings: FeatureSettings = FeatureSettings()) -> np.ndarray:
    """The samples of a PCM wav as float32 in [-1, 1]; refused unless mono, at ``settings.sampling_rate`` and
    at most ``settings.chunk_length`` seconds long."""
    path = Path(path)
    fix = f"convert it: sox {path.name} -r {settings.sampling_rate} -c 1 -b 16 out.wav"
    try:
        with wave.open(str(path), "rb") as file:
            rate, channels, width, count = file.getframerate(), file.getnchannels(), file.getsampwidth(), file.getnframes()
            if rate != settings.sampling_rate or channels != 1:
                raise AudioError(
                    f"{path}: {rate} Hz, {channels} channel(s); the model takes {settings.sampling_rate} Hz mono: {fix}"
                )
            if count > settings.n_samples:
                raise AudioError(
                    f"{path}: {count / rate:.1f} s; the model's window is {settings.chunk_length} s: cut the recording "
                    f"into pieces of at most {settings.chunk_length} s (sox {path.name} out.wav trim 0 {settings.chunk_length} : newfile : restart)"
                )
            frames = file.readframes(count)
    except (wave.Error, EOFError) as error:
        raise AudioError(f"{path}: not a PCM wav file the model can read ({error}); {fix}") from None
    except FileNotFoundError:
        raise AudioError(f"{path}: no such file") from None
    if width == 1:  # 8-bit wav is unsigned
        return (np.frombuffer(frames, np.uint8).astype(np.float32) - 128.0) / 128.0
    if width == 2:
        return np.frombuffer(frames, "<i2").astype(np.float32) / 32768.0
    if width == 4:
        return np.frombuffer(frames, "<i4").astype(np.float32) / 2147483648.0
    raise AudioError(f"{path}: {8 * width}-bit samples; {fix}")


def _hertz_to_mel(hertz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    mels = 3.0 * hertz / 200.0
    log = hertz >= 1000.0
    mels[log] = 15.0 + np.log(hertz[log] / 1000.0) * (27.0 / np.log(6.4))
    return mels


def _mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    hertz = 200.0 * mels / 3.0
    log = mels >= 15.0
    hertz[log] = 1000.0 * np.exp(np.log(6.4) / 27.0 * (mels[log] - 15.0))
    return hertz


def mel_filters(settings: FeatureSettings = FeatureSettings()) -> np.ndarray:
    """Slaney's triangular mel filters from 0 to 8 kHz, area-normalized: ``[1 + n_fft // 2, n_mels]`` float64."""
    edges = _mel_to_hertz(np.linspace(_hertz_to_mel(np.array([0.0]))[0], _hertz_to_mel(np.array([8000.0]))[0], settings.n_mels + 2))
    bins = np.linspace(0, settings.sampling_rate // 2, 1 + settings.n_fft // 2)
    slopes = edges[None, :] - bins[:, None]
    widths = np.diff(edges)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]


def log_mel(audio: np.ndarray, settings: FeatureSettings = FeatureSettings()) -> torch.Tensor:
    """``encoder``'s input ``[1, n_mels, n_frames]`` fp32 for ``audio`` (samples at the settings' rate, at most one window)."""
    if audio.ndim != 1 or len(audio) > settings.n_samples:
        raise AudioError(
            f"audio of shape {tuple(audio.shape)}: give mono samples, at most {settings.n_samples} "
            f"({settings.chunk_length} s at {settings.sampling_rate} Hz)"
        )
    return log_mel_windows(audio, settings)


def log_mel_windows(audio: np.ndarray, settings: FeatureSettings = FeatureSettings()) -> torch.Tensor:
    """``[windows, n_mels, n_frames]`` fp32 for mono ``audio`` of any length, as ``VoxtralProcessor`` makes them.

    The samples are padded to a whole number of windows (at least one), one
    spectrogram is computed over all of them (its floor 8 below the whole
    recording's maximum: ``WhisperFeatureExtractor`` with
    ``pad_to_multiple_of`` a window) and cut into windows of ``n_frames``.
    """
    if audio.ndim != 1:
        raise AudioError(f"audio of shape {tuple(audio.shape)}: give mono samples")
    windows = max(1, -(-len(audio) // settings.n_samples))
    waveform = torch.zeros(windows * settings.n_samples, dtype=torch.float32)
    waveform[: len(audio)] = torch.from_numpy(np.asarray(audio, dtype=np.float32))
    window = torch.hann_window(settings.n_fft)
    stft = torch.stft(waveform, settings.n_fft, settings.hop_length, window=window, return_complex=True)
    power = (stft[..., :-1].abs() ** 2).contiguous()
    mel = torch.from_numpy(mel_filters(settings)).to(torch.float32).T @ power
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).reshape(settings.n_mels, windows, settings.n_frames).transpose(0, 1).contiguous()
