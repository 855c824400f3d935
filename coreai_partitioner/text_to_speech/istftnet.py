"""Kokoro's iSTFTNet vocoder (``kokoro/istftnet.py``) in ops a Core AI delegate takes, to ``KModel``'s numbers.

- :class:`Stft`: ``torch.stft``/``torch.istft`` (complex) as convolutions with the DFT's rows;
- :func:`sine_source`: ``SourceModuleHnNSF`` with its two draws given, its interpolations written as their weights
  (:func:`linear_down`, :func:`linear_up`: over a symbolic length torch's would be float sizes the export guards on);
- :func:`residual`: ``AdainResBlk1d``, its nearest upsampling a repeat;
- :func:`vocode`: ``Generator.forward`` from them.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class Stft(nn.Module):
    """``istftnet.TorchSTFT``'s transform and inverse (``torch.stft``/``torch.istft``: Hann window, centred, reflect
    padding, one-sided) as convolutions with the DFT's rows, real arithmetic only."""

    def __init__(self, n_fft: int, hop: int, win_length: int) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        window = torch.hann_window(win_length, periodic=True, dtype=torch.float64)
        window = F.pad(window, ((n_fft - win_length) // 2, n_fft - win_length - (n_fft - win_length) // 2))
        bins = torch.arange(n_fft // 2 + 1, dtype=torch.float64).unsqueeze(1)
        angle = 2 * math.pi * bins * torch.arange(n_fft, dtype=torch.float64) / n_fft  # [bins, n_fft]
        twice = torch.full_like(bins, 2.0)  # irfft counts each bin but the first and (n_fft even) the last twice
        twice[0] = 1.0
        if n_fft % 2 == 0:
            twice[-1] = 1.0
        sine = torch.sin(angle)
        sine[0] = 0.0
        if n_fft % 2 == 0:
            sine[-1] = 0.0  # a real signal's DFT is real there (and irfft ignores the imaginary parts of those two)
        self.register_buffer("forward_real", (torch.cos(angle) * window).float().unsqueeze(1), persistent=False)
        self.register_buffer("forward_imag", (-sine * window).float().unsqueeze(1), persistent=False)
        self.register_buffer("inverse_real", (twice * torch.cos(angle) * window / n_fft).float().unsqueeze(1), persistent=False)
        self.register_buffer("inverse_imag", (-twice * sine * window / n_fft).float().unsqueeze(1), persistent=False)
        self.register_buffer("window_squared", (window**2).float().reshape(1, 1, -1), persistent=False)

    def transform(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[1, L]`` to magnitude and phase ``[1, n_fft // 2 + 1, frames]``."""
        padded = F.pad(x.unsqueeze(1), (self.n_fft // 2, self.n_fft // 2), mode="reflect")
        real = F.conv1d(padded, self.forward_real, stride=self.hop)
        imag = F.conv1d(padded, self.forward_imag, stride=self.hop)
        # torch.angle of a real bin below 0 is pi; atan2 of -0.0 (a sum of products with zeros) would give -pi
        phase = torch.where((imag == 0) & (real < 0), torch.pi, torch.atan2(imag, real))
        return torch.sqrt(real * real + imag * imag), phase

    def inverse(self, magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        """Magnitude and phase to ``[1, 1, hop * (frames - 1)]``, overlap-added and divided by the window's envelope."""
        signal = F.conv_transpose1d(magnitude * torch.cos(phase), self.inverse_real, stride=self.hop)
        signal = signal + F.conv_transpose1d(magnitude * torch.sin(phase), self.inverse_imag, stride=self.hop)
        envelope = F.conv_transpose1d(torch.ones_like(magnitude[:, :1]), self.window_squared, stride=self.hop)
        half = self.n_fft // 2
        return (signal / envelope)[..., half : signal.shape[-1] - half]


def residual(block: nn.Module, x: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
    """``istftnet.AdainResBlk1d.forward``, its shortcut's nearest upsampling by 2 a repeat of each sample (the same
    numbers; ``F.interpolate`` over a symbolic length leaves an int64 ``index`` outside the delegate)."""
    out = block.actv(block.norm1(x, style))
    out = block.conv1(block.dropout(block.pool(out)))
    out = block.conv2(block.dropout(block.actv(block.norm2(out, style))))
    if block.upsample_type != "none":
        x = x.unsqueeze(-1).expand(-1, -1, -1, 2).reshape(x.shape[0], x.shape[1], -1)
    if block.learned_sc:
        x = block.conv1x1(x)
    return (out + x) * torch.rsqrt(torch.tensor(2.0))


def linear_down(x: torch.Tensor, scale: int) -> torch.Tensor:
    """``F.interpolate(x, scale_factor=1 / scale, mode="linear")`` of ``x`` ``[1, C, L * scale]``: each output the
    mean of the two middle samples of its ``scale`` (odd: the middle one).  A whole scale's weights, written out: over
    a symbolic length torch's would be a float size the export guards on."""
    blocks = x.reshape(x.shape[0], x.shape[1], -1, scale)
    if scale % 2:
        return blocks[..., scale // 2]
    return 0.5 * blocks[..., scale // 2 - 1] + 0.5 * blocks[..., scale // 2]


def linear_up(x: torch.Tensor, scale: int) -> torch.Tensor:
    """``F.interpolate(x, scale_factor=scale, mode="linear")`` of ``x`` ``[1, C, L]``: output ``j * scale + r`` lies
    ``(r + 0.5) / scale - 0.5`` from sample ``j``, between it and the sample before (behind) or after, the ends
    repeated (as torch clamps)."""
    offset = (torch.arange(scale, dtype=torch.float64) + 0.5) / scale - 0.5
    behind = offset < 0
    weight = torch.where(behind, 1 + offset, offset).to(x.dtype)  # of the later of the two samples
    before = torch.cat([x[..., :1], x[..., :-1]], dim=-1).unsqueeze(-1)
    after = torch.cat([x[..., 1:], x[..., -1:]], dim=-1).unsqueeze(-1)
    here = x.unsqueeze(-1)
    earlier, later = torch.where(behind, before, here), torch.where(behind, here, after)
    return ((1 - weight) * earlier + weight * later).reshape(x.shape[0], x.shape[1], -1)


def sine_source(generator: nn.Module, f0: torch.Tensor, phases: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``istftnet.SourceModuleHnNSF`` on ``f0`` ``[1, L, 1]``, its ``SineGen``'s draws given: ``phases`` ``[1, H]``
    (``torch.rand``, the first harmonic's set to 0 here as there) and ``noise`` ``[1, L, H]`` (``torch.randn_like``)."""
    source = generator.m_source
    sines = source.l_sin_gen
    harmonics = torch.arange(1, sines.harmonic_num + 2, dtype=f0.dtype)
    radians = (f0 * harmonics / sines.sampling_rate) % 1
    first = torch.ones_like(harmonics)
    first[0] = 0.0
    radians = torch.cat([radians[:, :1] + (phases * first).unsqueeze(1), radians[:, 1:]], dim=1)
    scale = int(sines.upsample_scale)
    radians = linear_down(radians.transpose(1, 2), scale).transpose(1, 2)
    phase = torch.cumsum(radians, dim=1) * 2 * torch.pi
    phase = linear_up(phase.transpose(1, 2) * scale, scale).transpose(1, 2)
    voiced = (f0 > sines.voiced_threshold).to(f0.dtype)
    amplitude = voiced * sines.noise_std + (1 - voiced) * sines.sine_amp / 3
    waves = torch.sin(phase) * sines.sine_amp * voiced + amplitude * noise
    return source.l_tanh(source.l_linear(waves))


def vocode(generator: nn.Module, stft: Stft, x: torch.Tensor, style: torch.Tensor, f0: torch.Tensor, phases, noise):
    """``istftnet.Generator.forward`` with its source's draws given (:func:`sine_source`) and :class:`Stft`."""
    scale = int(generator.m_source.l_sin_gen.upsample_scale)
    f0 = f0.unsqueeze(-1).expand(-1, -1, scale).reshape(1, -1, 1)  # f0_upsamp: each value repeated (nearest, whole scale)
    harmonic = sine_source(generator, f0, phases, noise).transpose(1, 2).squeeze(1)
    har = torch.cat(stft.transform(harmonic), dim=1)
    for i in range(generator.num_upsamples):
        x = F.leaky_relu(x, negative_slope=0.1)
        source = generator.noise_res[i](generator.noise_convs[i](har), style)
        x = generator.ups[i](x)
        if i == generator.num_upsamples - 1:
            x = generator.reflection_pad(x)
        x = x + source
        blocks = generator.resblocks[i * generator.num_kernels : (i + 1) * generator.num_kernels]
        total = blocks[0](x, style)
        for block in blocks[1:]:
            total = total + block(x, style)
        x = total / generator.num_kernels
    x = generator.conv_post(F.leaky_relu(x))
    bins = generator.post_n_fft // 2 + 1
    return stft.inverse(torch.exp(x[:, :bins, :]), torch.sin(x[:, bins:, :]))
