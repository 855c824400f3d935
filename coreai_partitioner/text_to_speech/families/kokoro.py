"""Kokoro-82M (the ``kokoro`` package's ``KModel``: StyleTTS 2 with an iSTFTNet vocoder) as two methods split where
the length becomes data-dependent.

``KModel.forward_with_tokens(input_ids, ref_s, speed)`` reads the phoneme ids
with ALBERT, predicts each one's duration, repeats the text features over
that many frames, predicts F0 and energy over the frames and vocodes them:
the frame count is a value the model computes.  Split there:

- :class:`Durations`, ``durations(input_ids [1, T], attention_mask [1, T],
  style [1, 256], speed [1]) -> (durations [1, T], prosody [1, T, C + 128],
  text [1, C, T])``: ALBERT, the duration encoder and predictor and the text
  encoder, ``T`` fixed at ``max_tokens`` (the ids padded, the mask saying
  which are; a padded token lasts 0 frames);
- :class:`Frames`, ``decoder(durations, prosody, text, style, phases [1, H],
  noise [1, F, S * H]) -> waveform [1, F * S]``: the features over their
  frames, F0 and energy, and the vocoder with its sine source, ``F`` (the
  sum of the durations) bounded-dynamic up to ``max_frames``; ``S`` samples
  a frame, ``H`` harmonics.  The source's noises are inputs, drawn by the
  loop as ``KModel`` draws them.

Kokoro's LSTMs run over a length the program must fix (torch.export unrolls
a recurrence over its steps), and over padding ``KModel`` packs away: each is
:func:`lstm`, unrolled over ``max_tokens`` or ``max_frames`` steps and holding
its state through a step that is not real, which is what packing computes.
The vocoder's ``torch.stft``/``torch.istft`` (complex, which no delegate
takes) are convolutions with the same transform (:mod:`.istftnet`).

:func:`synthesize` is the loop; drawing the source's noises from
``torch.manual_seed(seed)`` as ``KModel`` draws them, it gives the waveform
``torch.manual_seed(seed); model.forward_with_tokens(...)`` gives.
Grapheme-to-phoneme (Kokoro's ``KPipeline``, misaki) stays with the app, as
in Kokoro's own ports: the program takes phoneme ids.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn import functional as F

from coreai_partitioner.partition.boundaries import outside_delegate
from coreai_partitioner.text_to_speech.istftnet import Stft, residual, vocode

if TYPE_CHECKING:  # the program module loads ExecuTorch's runtime: imported where a run needs it
    from coreai_partitioner.text_to_speech.program import SpeechProgram, SpeechReference

NAME = "kokoro"
#: What the program's ``get_family`` says.
CODE = 2
MODEL_TYPES = ("kokoro",)
HEADS: tuple[str, ...] = ()  # its config.json is KModel's own, with no architectures: found by is_checkpoint
TAKES = "a Kokoro-82M directory (KModel's config.json and .pth)"
TITLE = "Kokoro (KModel)"
#: ``--max-tokens`` and ``--max-frames`` where not given (the tokens at most its ALBERT's positions): its LSTMs are
#: unrolled over both.
LIMITS = (128, 512)
#: Its ``config.json``: the ``vocab`` an app makes the phoneme ids with.
ID_FILES = ("config.json",)
AGAINST = "KModel.forward_with_tokens at the same seed and voice"
#: ``KModel`` splits its voice (``ref_s``, 256 wide) here: the decoder's style, then the prosody's.
STYLE_SPLIT = 128
#: The sampling rate ``KModel``'s sine source is built for (``istftnet.Generator``).
SAMPLING_RATE = 24000
#: The weights files ``KModel`` knows by name (``KModel.MODEL_NAMES``), looked for first in a checkpoint directory.
WEIGHTS = ("kokoro-v1_0.pth", "kokoro-v1_1-zh.pth")


class UnsupportedKokoro(ValueError):
    """A Kokoro checkpoint this export does not take; names the field or file and the fix."""


Unsupported = UnsupportedKokoro


@dataclass(frozen=True)
class KokoroConfig:
    """A Kokoro checkpoint's ``config.json`` (no ``model_type``: the file is ``KModel``'s own), and its weights file."""

    raw: dict
    weights: Path | None = None

    model_type = "kokoro"
    sampling_rate = SAMPLING_RATE

    def to_dict(self) -> dict:
        return dict(self.raw)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "raw":  # copying and pickling ask before raw exists
            raise AttributeError(name)
        try:
            return self.raw[name]
        except KeyError:
            raise AttributeError(name) from None


def is_checkpoint(directory: Path) -> bool:
    """A directory holding Kokoro's ``config.json`` (its ``istftnet`` and ``plbert`` sections)."""
    try:
        raw = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and "istftnet" in raw and "plbert" in raw


def read_config(checkpoint: Path) -> KokoroConfig:
    """A Kokoro checkpoint directory's config and weights file, checked (:func:`check_config`)."""
    checkpoint = Path(checkpoint)
    raw = json.loads((checkpoint / "config.json").read_text())
    named = [checkpoint / name for name in WEIGHTS if (checkpoint / name).is_file()]
    found = named or sorted(checkpoint.glob("*.pth"))
    if len(found) != 1:
        what = "no *.pth weights file" if not found else f"{len(found)} *.pth files ({', '.join(p.name for p in found)})"
        raise UnsupportedKokoro(
            f"kokoro: {checkpoint} has {what}; give a directory with Kokoro's config.json and one weights file "
            f"({WEIGHTS[0]})"
        )
    config = KokoroConfig(raw, found[0])
    check_config(config)
    return config


def check_config(config: KokoroConfig) -> None:
    """Refuse, from the config alone, what ``KModel`` itself would fail on later (its widths are partly fixed)."""
    raw = config.raw
    missing = [key for key in ("vocab", "n_token", "plbert", "hidden_dim", "style_dim", "n_layer", "istftnet") if key not in raw]
    if missing:
        raise UnsupportedKokoro(f"kokoro: config.json has no {', '.join(missing)}; give Kokoro's own config.json")
    if raw["style_dim"] != STYLE_SPLIT:
        raise UnsupportedKokoro(
            f"kokoro: style_dim={raw['style_dim']}; KModel splits its 256-wide voice at {STYLE_SPLIT}, so it takes "
            f"style_dim {STYLE_SPLIT} only"
        )
    if raw["hidden_dim"] != 512:
        raise UnsupportedKokoro(
            f"kokoro: hidden_dim={raw['hidden_dim']}; KModel's decoder reads 512 text channels (istftnet.Decoder's "
            "asr_res), so it takes hidden_dim 512 only"
        )


def kmodel_class() -> type:
    """``kokoro.model.KModel``, without running ``kokoro/__init__.py``.

    The package's ``__init__`` imports its G2P pipeline (misaki[en], spaCy,
    espeak-ng), which the model needs none of, and replaces every loguru
    handler of the host process; loaded here as a bare package path instead
    (an already imported ``kokoro`` is used as it is).  Kokoro's own debug
    lines are off, as its ``__init__`` leaves them.
    """
    if "kokoro.model" not in sys.modules:
        spec = importlib.util.find_spec("kokoro")
        if spec is None or not spec.submodule_search_locations:
            raise UnsupportedKokoro(
                "kokoro: the kokoro package is not installed: pip install --no-deps kokoro==0.9.4 loguru "
                "(its grapheme-to-phoneme pipeline, misaki, is the app's and not needed here)"
            )
        package = sys.modules.get("kokoro")
        if package is None:
            package = types.ModuleType("kokoro")
            package.__path__ = list(spec.submodule_search_locations)
            sys.modules["kokoro"] = package
            try:
                importlib.import_module("kokoro.model")
            finally:
                del sys.modules["kokoro"]  # a later ``import kokoro`` runs the real __init__, finding kokoro.model
        else:
            importlib.import_module("kokoro.model")
    from loguru import logger

    logger.disable("kokoro")
    return sys.modules["kokoro.model"].KModel


def load_kmodel(config: KokoroConfig, weights: Path | None = None) -> nn.Module:
    """``KModel`` of ``config`` with ``weights`` (a ``.pth``; default the config's), in fp32 eval mode; nothing is
    downloaded."""
    path = weights or config.weights
    if path is None:
        raise UnsupportedKokoro("kokoro: no weights file; give the checkpoint directory holding it")
    with warnings.catch_warnings():  # torch's about Kokoro's code: its weight_norm, its one-layer LSTMs' dropout
        warnings.filterwarnings("ignore", message=r"`torch.nn.utils.weight_norm` is deprecated")
        warnings.filterwarnings("ignore", message="dropout option adds dropout after all but last recurrent layer")
        model = kmodel_class()(repo_id="hexgrad/Kokoro-82M", config=config.to_dict(), model=str(path))
    return model.eval()


# ---------------------------------------------------------------- the methods


def lstm(module: nn.LSTM, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``module`` (one layer, batch first, either direction) over ``x`` ``[1, L, I]`` unrolled, a step where
    ``valid`` ``[1, L]`` is false keeping the state as it was and giving zeros: what ``KModel``'s packed sequences
    compute, padding at any end.  ``[1, L, H]`` or ``[1, L, 2H]``."""
    if module.num_layers != 1 or module.proj_size or not module.batch_first or not module.bias:
        raise UnsupportedKokoro(
            f"kokoro: an LSTM of {module.num_layers} layers (proj_size {module.proj_size}, bias {module.bias}); "
            "KModel's have one layer with biases"
        )
    length, hidden = x.shape[1], module.hidden_size
    directions = []
    for reverse, (weight_ih, weight_hh, bias_ih, bias_hh) in enumerate(module.all_weights):  # forward, then reverse
        projected = F.linear(x, weight_ih, bias_ih)
        h = c = x.new_zeros(1, hidden)
        outputs: list[torch.Tensor] = [x] * length
        for step in (range(length - 1, -1, -1) if reverse else range(length)):
            gates = projected[:, step] + F.linear(h, weight_hh, bias_hh)
            i, f, g, o = gates.chunk(4, dim=1)
            c_next = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h_next = torch.sigmoid(o) * torch.tanh(c_next)
            real = valid[:, step : step + 1]
            c, h = torch.where(real, c_next, c), torch.where(real, h_next, h)
            outputs[step] = torch.where(real, h_next, torch.zeros_like(h_next))
        directions.append(torch.stack(outputs, dim=1))
    return torch.cat(directions, dim=-1)


def duration_encoder(encoder: nn.Module, x: torch.Tensor, style: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """``modules.DurationEncoder.forward`` over padded ids: its LSTMs are :func:`lstm`.  ``[1, T, C + S]``."""
    s = style.expand(x.shape[2], 1, -1)  # [T, 1, S]
    x = torch.cat([x.permute(2, 0, 1), s], dim=-1).masked_fill(padding.unsqueeze(-1).transpose(0, 1), 0.0)
    x = x.transpose(0, 1).transpose(-1, -2)  # [1, C + S, T]
    for block in encoder.lstms:
        if isinstance(block, nn.LSTM):
            x = lstm(block, x.transpose(-1, -2), ~padding).transpose(-1, -2)
        else:  # an AdaLayerNorm
            x = block(x.transpose(-1, -2), style).transpose(-1, -2)
            x = torch.cat([x, s.permute(1, 2, 0)], dim=1).masked_fill(padding.unsqueeze(1), 0.0)
    return x.transpose(-1, -2)


def text_encoder(encoder: nn.Module, input_ids: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """``modules.TextEncoder.forward`` over padded ids: its LSTM is :func:`lstm`.  ``[1, C, T]``."""
    mask = padding.unsqueeze(1)
    x = encoder.embedding(input_ids).transpose(1, 2).masked_fill(mask, 0.0)
    for block in encoder.cnn:
        x = block(x).masked_fill(mask, 0.0)
    x = lstm(encoder.lstm, x.transpose(1, 2), ~padding).transpose(-1, -2)
    return x.masked_fill(mask, 0.0)


class Durations(nn.Module):
    """``KModel``'s ALBERT, duration encoder and predictor and text encoder over ``T`` padded ids.

    In the device form (``device``) the int64 ids and mask cross the delegate as fp32 (upstream's on-device runtime
    passes fp16/fp32 tensors only) and are cast to int32 inside it.
    """

    def __init__(self, model: nn.Module, device: bool = False) -> None:
        super().__init__()
        self.device = device
        self.bert, self.bert_encoder = model.bert, model.bert_encoder
        self.predictor, self.text_encoder = model.predictor, model.text_encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, style: torch.Tensor, speed: torch.Tensor):
        if self.device:
            with outside_delegate():
                input_ids, attention_mask = input_ids.to(torch.float32), attention_mask.to(torch.float32)
            input_ids, attention_mask = input_ids.to(torch.int32), attention_mask.to(torch.int32)
        padding = attention_mask == 0  # KModel's text_mask
        hidden = self.bert(input_ids, attention_mask=attention_mask.int())
        prosody = duration_encoder(
            self.predictor.text_encoder, self.bert_encoder(hidden).transpose(-1, -2), style[:, STYLE_SPLIT:], padding
        )
        x = lstm(self.predictor.lstm, prosody, ~padding)
        duration = torch.sigmoid(self.predictor.duration_proj(x)).sum(dim=-1) / speed
        durations = torch.round(duration).clamp(min=1) * attention_mask.to(duration.dtype)
        return durations, prosody.contiguous(), text_encoder(self.text_encoder, input_ids, padding).contiguous()


class Frames(nn.Module):
    """``KModel``'s features over their frames, its F0/energy predictor and its decoder: the waveform.

    ``F`` is ``noise``'s second size (``[1, F, S * H]``: ``KModel``'s ``[1, F * S, H]`` draw, reshaped).  The
    alignment is built over ``max_frames`` columns, so the shared LSTM's unrolled steps are fixed; the columns
    from ``F`` on are not real, and are dropped after it.
    """

    def __init__(self, model: nn.Module, max_frames: int) -> None:
        super().__init__()
        self.predictor, self.decoder = model.predictor, model.decoder
        self.max_frames = max_frames + 1  # one column never real: slicing F of them is never the whole (no guard on F)
        generator = model.decoder.generator
        self.harmonics = generator.m_source.l_sin_gen.harmonic_num + 1
        stft = generator.stft
        self.stft = Stft(stft.filter_length, stft.hop_length, stft.win_length)

    def forward(self, durations, prosody, text, style, phases, noise):
        frames = noise.shape[1]
        positions = torch.arange(self.max_frames, dtype=durations.dtype)
        covered = (positions < torch.cumsum(durations, dim=-1).unsqueeze(-1)).to(prosody.dtype)  # [1, T, M]
        alignment = covered - F.pad(covered, [0, 0, 1, 0])[:, :-1]  # token t: frames [end of t - 1, end of t)
        features = prosody.transpose(-1, -2) @ alignment  # [1, C + S, M]
        real = positions.unsqueeze(0) < frames
        x = lstm(self.predictor.shared, features.transpose(-1, -2), real)[:, :frames].transpose(-1, -2)
        s = style[:, STYLE_SPLIT:]
        f0, energy = x, x
        for block in self.predictor.F0:
            f0 = residual(block, f0, s)
        for block in self.predictor.N:
            energy = residual(block, energy, s)
        f0, energy = self.predictor.F0_proj(f0).squeeze(1), self.predictor.N_proj(energy).squeeze(1)
        asr = text @ alignment[:, :, :frames]
        return self._decode(asr, f0, energy, style[:, :STYLE_SPLIT], phases, noise.reshape(1, -1, self.harmonics))

    def _decode(self, asr, f0_curve, energy, style, phases, noise):
        """``istftnet.Decoder.forward``, its generator :func:`vocode`; ``[1, samples]``."""
        decoder = self.decoder
        f0 = decoder.F0_conv(f0_curve.unsqueeze(1))
        n = decoder.N_conv(energy.unsqueeze(1))
        x = residual(decoder.encode, torch.cat([asr, f0, n], dim=1), style)
        text_residual = decoder.asr_res(asr)
        joined = True
        for block in decoder.decode:
            if joined:
                x = torch.cat([x, text_residual, f0, n], dim=1)
            x = residual(block, x, style)
            if block.upsample_type != "none":
                joined = False
        # the waveform laid out as it is read: the inverse transform's trim is a view whose batch stride is the
        # untrimmed length, which .contiguous() keeps (a size-1 dimension); the device form's contract
        waveform = vocode(decoder.generator, self.stft, x, style, f0_curve, phases, noise).reshape(1, -1)
        return waveform.clone(memory_format=torch.contiguous_format)


def samples_per_frame(model: nn.Module) -> int:
    """Waveform samples per frame of the durations: the F0 curve's two per frame, each upsampled to the source's rate."""
    return 2 * int(model.decoder.generator.m_source.l_sin_gen.upsample_scale)


def lower_kokoro(
    model: nn.Module, *, max_tokens: int = 128, max_frames: int = 512, device: bool = False, **partitioner_options: Any
):
    """Both methods lowered to one ``.pte`` (:func:`~coreai_partitioner.lowering.methods.lower_method_modules`),
    ``T`` fixed at ``max_tokens`` and ``F`` from 1 to ``max_frames``, in the host or (``device``) the device form;
    the ``EdgeProgramManager``.

    Constant methods tell the loop what it needs: ``get_family`` (2), ``get_sampling_rate``,
    ``get_samples_per_frame``, ``get_harmonics``, ``get_max_tokens``, ``get_max_frames``.
    """
    from coreai_partitioner.lowering.methods import lower_method_modules

    if max_tokens < 3 or max_frames < 2:
        raise UnsupportedKokoro(f"kokoro: max_tokens={max_tokens}, max_frames={max_frames}; give at least 3 and 2")
    if max_tokens > model.context_length:
        raise UnsupportedKokoro(f"kokoro: max_tokens={max_tokens}; KModel reads at most {model.context_length}")
    frames = Frames(model, max_frames).eval()
    width, channels = model.predictor.lstm.input_size, model.text_encoder.embedding.embedding_dim
    per_frame, harmonics = samples_per_frame(model), frames.harmonics
    samples = {
        "durations": (
            torch.ones(1, max_tokens, dtype=torch.long), torch.ones(1, max_tokens, dtype=torch.long),
            torch.zeros(1, 2 * STYLE_SPLIT), torch.ones(1),
        ),
        "decoder": (
            torch.ones(1, max_tokens), torch.zeros(1, max_tokens, width), torch.zeros(1, channels, max_tokens),
            torch.zeros(1, 2 * STYLE_SPLIT), torch.zeros(1, harmonics), torch.zeros(1, 2, per_frame * harmonics),
        ),
    }
    frames_dim = torch.export.Dim("F", min=1, max=max_frames)
    dynamic_shapes = {"durations": None, "decoder": (None, None, None, None, None, {1: frames_dim})}
    constants = {
        "get_family": CODE,
        "get_sampling_rate": SAMPLING_RATE,
        "get_samples_per_frame": per_frame,
        "get_harmonics": harmonics,
        "get_max_tokens": max_tokens,
        "get_max_frames": max_frames,
    }
    modules = {"durations": Durations(model, device).eval(), "decoder": frames}
    with warnings.catch_warnings():
        # Kokoro's layers keep torch's first weight_norm, which sets each weight from its norm and direction in a
        # hook before every call: traced as such, and torch.export says so of every layer
        warnings.filterwarnings("ignore", message="The tensor attributes? .* assigned during export")
        return lower_method_modules(
            modules, samples, device=device, constant_methods=constants, dynamic_shapes=dynamic_shapes,
            bounded=max_frames * per_frame if device else None, **partitioner_options,
        )


# ---------------------------------------------------------------- the loop


def voice_style(voice: torch.Tensor | str | Path, count: int) -> torch.Tensor:
    """The style ``[1, 256]`` for ``count`` phonemes: a Kokoro voice file (``[510, 1, 256]``, a style per phoneme
    count, which ``KPipeline`` indexes by ``count - 1``) or one style."""
    pack = torch.load(voice, map_location="cpu", weights_only=True) if isinstance(voice, (str, Path)) else voice
    pack = torch.as_tensor(pack, dtype=torch.float32)
    if pack.shape[-1] != 2 * STYLE_SPLIT:
        raise ValueError(f"a voice of shape {list(pack.shape)}; Kokoro's are [510, 1, 256] or one style [1, 256]")
    if pack.dim() == 3:
        if not 1 <= count <= pack.shape[0]:
            raise ValueError(f"{count} phoneme id(s); the voice has styles for 1 to {pack.shape[0]}")
        return pack[count - 1].reshape(1, -1)
    return pack.reshape(1, -1)


def _ids(phonemes: list[int] | torch.Tensor) -> torch.Tensor:
    """``KModel.forward``'s ids: the phoneme ids between two 0s."""
    ids = torch.as_tensor(phonemes, dtype=torch.long).reshape(-1)
    return torch.cat([torch.zeros(1, dtype=torch.long), ids, torch.zeros(1, dtype=torch.long)]).unsqueeze(0)


def _durations_call(program: SpeechProgram, ids: torch.Tensor, style: torch.Tensor, speed: float) -> list[torch.Tensor]:
    count, most = ids.shape[1], program.constant("get_max_tokens")
    if count > most:
        raise ValueError(f"{count - 2} phoneme id(s); {program.path} takes at most {most - 2}: export it with a larger --max-tokens")
    padded = (0, most - count)
    mask = F.pad(torch.ones_like(ids), padded)
    return program.run("durations", F.pad(ids, padded), mask, style, torch.tensor([float(speed)]))


def durations_of(program: SpeechProgram, phonemes, style: torch.Tensor, *, speed: float = 1.0) -> torch.Tensor:
    """Each id's duration in frames (``[T + 2]``, the two boundary 0s with them), as ``KModel`` predicts it."""
    ids = _ids(phonemes)
    return _durations_call(program, ids, style, speed)[0][0, : ids.shape[1]]


def synthesize(program: SpeechProgram, phonemes, style: torch.Tensor, *, speed: float = 1.0, seed: int = 0) -> torch.Tensor:
    """The waveform ``[samples]`` of ``phonemes`` (ids of ``KModel.vocab``) in the voice ``style`` ``[1, 256]``.

    The source's noises are drawn from ``torch.manual_seed(seed)`` as ``KModel`` draws them, so the waveform is the one
    ``torch.manual_seed(seed); model.forward_with_tokens([[0, *phonemes, 0]], style, speed)`` gives.
    """
    ids = _ids(phonemes)
    durations, prosody, text = _durations_call(program, ids, style, speed)
    frames = int(durations.sum())
    max_frames = program.constant("get_max_frames")
    if frames > max_frames:
        raise ValueError(
            f"the durations add up to {frames} frames; {program.path} decodes at most {max_frames}: export it with a "
            "larger --max-frames, or give fewer phonemes"
        )
    harmonics, per_frame = program.constant("get_harmonics"), program.constant("get_samples_per_frame")
    torch.manual_seed(seed)
    phases = torch.rand(1, harmonics)
    # as SineGen draws it: randn_like of its waves, a transposed [1, H, L] (torch fills a strided tensor element by
    # element, other numbers than a contiguous one's from the same seed)
    noise = torch.randn_like(torch.empty(1, harmonics, frames * per_frame).transpose(1, 2))
    noise = noise.reshape(1, frames, per_frame * harmonics)
    return program.run("decoder", durations, prosody, text, style, phases, noise)[0][0]


def reference(model: nn.Module, phonemes, style: torch.Tensor, *, speed: float = 1.0, seed: int = 0):
    """``KModel.forward_with_tokens``'s own waveform ``[samples]`` and durations ``[T + 2]`` at ``seed``: what
    :func:`synthesize` and :func:`durations_of` give through a ``.pte``."""
    torch.manual_seed(seed)
    with torch.no_grad():
        audio, durations = model.forward_with_tokens(_ids(phonemes), style, speed)
    return audio.reshape(-1), durations.reshape(-1).to(torch.float32)


# ---------------------------------------------------------------- the family, as the export command asks it

#: The tiny Kokoro's ``config.json``: a vocabulary of ten phonemes, Kokoro-82M's fixed widths (1024 decoder channels,
#: 512 text channels, a 256-wide voice), one layer, a two-layer ALBERT, two small upsamplings in the vocoder.
TINY = {
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


def load_config(checkpoint: Path) -> KokoroConfig:
    return read_config(checkpoint)


def load_model(checkpoint: Path, config: KokoroConfig, dtype: torch.dtype) -> nn.Module:
    """``KModel`` in fp32 (the export's only dtype)."""
    return load_kmodel(config)


def tiny_config() -> KokoroConfig:
    return KokoroConfig(TINY)


def tiny_model(config: KokoroConfig) -> nn.Module:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:  # KModel always loads a weights file: none of its weights
        weights = Path(directory) / "random.pth"
        torch.save({}, weights)
        return load_kmodel(config, weights)


def limits(config: KokoroConfig, max_tokens: int | None, max_frames: int | None) -> tuple[int, int]:
    """A config ``KModel`` takes; the flags' limits, 3 tokens (two boundary 0s) to its ALBERT's positions, at least 2
    frames."""
    check_config(config)
    context = config.plbert["max_position_embeddings"]
    tokens = min(LIMITS[0], context) if max_tokens is None else max_tokens
    frames = LIMITS[1] if max_frames is None else max_frames
    if not 3 <= tokens <= context or frames < 2:
        raise UnsupportedKokoro(
            f"--max-tokens {tokens} --max-frames {frames}: Kokoro takes 3 to {context} tokens (its ALBERT's "
            "positions) and at least 2 frames"
        )
    return tokens, frames


def layers(config: KokoroConfig) -> str:
    return f"{config.n_layer} layer(s)"


def methods(config: KokoroConfig, max_tokens: int, max_frames: int) -> list[str]:
    return [
        f"durations(input_ids [1, {max_tokens}], attention_mask, style [1, {2 * STYLE_SPLIT}], speed [1])",
        f"decoder(durations, prosody, text, style, phases, noise [1, F <= {max_frames}, ...]) -> waveform",
    ]


def seeded_reference(model: nn.Module, config: KokoroConfig, max_tokens: int) -> SpeechReference:
    """Seeded random phoneme ids (at most 16, the boundary 0s besides) in a seeded random voice, at seed 0."""
    from coreai_partitioner.text_to_speech.program import SpeechReference

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, config.n_token, (min(max_tokens - 2, 16),), generator=generator).tolist()
    style = torch.randn(1, 2 * STYLE_SPLIT, generator=generator)
    return SpeechReference(ids, 0, *reference(model, ids, style, seed=0), voice=style)


def lower(model: nn.Module, **options: Any):
    return lower_kokoro(model, **options)


def replay(program: SpeechProgram, verified: SpeechReference) -> tuple[torch.Tensor, torch.Tensor]:
    durations = durations_of(program, verified.ids, verified.voice)
    return durations, synthesize(program, verified.ids, verified.voice, seed=verified.seed)


def speak(program: SpeechProgram, ids: list[int], *, voice: Path | None, speed: float, seed: int) -> torch.Tensor:
    if voice is None:
        raise ValueError(f"{program.path} is a Kokoro program: give its voice with --voice (voices/*.pt)")
    return synthesize(program, ids, voice_style(voice, len(ids)), speed=speed, seed=seed)
