"""transformers' ``VitsModel`` (MMS-TTS) as two methods split where the length becomes data-dependent.

``VitsModel.forward`` encodes the tokens, predicts each token's duration,
expands the text to that many spectrogram frames, and decodes the frames to a
waveform: the frame count is a value the model computes, so the program
cannot know its sizes.  Split there, every size is an input's:

- :class:`Durations`, ``durations(input_ids [1, T], attention_mask [1, T],
  duration_noise [1, 2, T]) -> (durations [1, T], prior_means [1, T, C],
  prior_log_variances [1, T, C])``: the text encoder and the duration
  predictor (the stochastic one's noise an input, not drawn inside), ``T``
  fixed at ``max_tokens``: the ids padded, their mask saying which are
  (transformers' relative-position attention branches on the length against
  its window, which no symbolic ``T`` survives); a padded token lasts 0 frames;
- :class:`Frames`, ``decoder(durations, prior_means, prior_log_variances,
  noise [1, C, F]) -> waveform [1, F * hop]``: each token's prior repeated
  over its frames, the flow run backwards and the HiFi-GAN decoder, ``F``
  (the sum of the durations, at least 1) bounded-dynamic up to ``max_frames``.

:func:`synthesize` is the loop between them; drawing the two noises from one
``torch.manual_seed(seed)`` in the order ``VitsModel.forward`` draws them, it
gives the waveform ``transformers.set_seed(seed); model(input_ids)`` gives.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from coreai_partitioner.partition.boundaries import outside_delegate

if TYPE_CHECKING:  # the program module loads ExecuTorch's runtime: imported where a run needs it
    from coreai_partitioner.text_to_speech.program import SpeechProgram, SpeechReference

NAME = "vits"
#: What the program's ``get_family`` says.
CODE = 1
MODEL_TYPES = ("vits",)
HEADS = ("VitsModel",)
TAKES = "a VitsModel (MMS-TTS)"
TITLE = "VitsModel (vits)"
#: ``--max-tokens`` and ``--max-frames`` where not given: 65 s of MMS-TTS at 16 kHz.
LIMITS = (256, 4096)
#: ``VitsTokenizer``'s files: what an app makes the ids with.
ID_FILES = ("vocab.json", "tokenizer_config.json", "special_tokens_map.json")
AGAINST = "VitsModel's forward at the same seed"


class UnsupportedVits(ValueError):
    """A ``VitsModel`` this export does not take; names the field and the fix."""


def check_model(model: nn.Module) -> None:
    """Refuse, before any export work, what the two methods do not carry (:func:`check_config`)."""
    check_config(model.config)


Unsupported = UnsupportedVits


def check_config(config: Any) -> None:
    """Refuse, from the config alone, what the two methods do not carry: several speakers."""
    if config.num_speakers > 1:
        raise UnsupportedVits(
            f"vits: num_speakers={config.num_speakers}; the text-to-speech export takes a single-speaker checkpoint "
            "(MMS-TTS's are): a speaker embedding is not an input of its methods yet"
        )


class Durations(nn.Module):
    """``VitsModel``'s text encoder and duration predictor; the stochastic predictor's noise is an input.

    In the device form (``device``) the int64 ids and mask cross the delegate as fp32 (upstream's on-device runtime
    passes fp16/fp32 tensors only) and are cast to int32 inside it, as the text decoders' device forms take theirs.
    """

    def __init__(self, model: nn.Module, device: bool = False) -> None:
        super().__init__()
        check_model(model)
        self.device = device
        self.text_encoder = model.text_encoder
        self.duration_predictor = model.duration_predictor
        self.stochastic = bool(model.config.use_stochastic_duration_prediction)
        self.noise_scale_duration = float(model.noise_scale_duration)
        self.length_scale = 1.0 / float(model.speaking_rate)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, duration_noise: torch.Tensor):
        if self.device:
            with outside_delegate():
                input_ids, attention_mask = input_ids.to(torch.float32), attention_mask.to(torch.float32)
            input_ids, attention_mask = input_ids.to(torch.int32), attention_mask.to(torch.int32)
        mask = attention_mask.unsqueeze(-1).to(self.text_encoder.embed_tokens.weight.dtype)
        encoded = self.text_encoder(
            input_ids=input_ids, padding_mask=mask, attention_mask=attention_mask, return_dict=True
        )
        hidden = encoded.last_hidden_state.transpose(1, 2)
        mask = mask.transpose(1, 2)
        if self.stochastic:
            log_duration = self._stochastic(hidden, mask, duration_noise)
        else:
            log_duration = self.duration_predictor(hidden, mask, None)
        durations = torch.ceil(torch.exp(log_duration) * mask * self.length_scale)
        # the priors laid out as they are read (transformers' are transposed views; the device form's contract)
        return durations[:, 0], encoded.prior_means.contiguous(), encoded.prior_log_variances.contiguous()

    def _stochastic(self, hidden: torch.Tensor, mask: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """``VitsStochasticDurationPredictor.forward(..., reverse=True)`` with ``noise`` for its ``torch.randn``."""
        predictor = self.duration_predictor
        inputs = predictor.conv_pre(hidden)
        inputs = predictor.conv_dds(inputs, mask)
        inputs = predictor.conv_proj(inputs) * mask
        flows = list(reversed(predictor.flows))
        flows = flows[:-2] + [flows[-1]]  # as transformers: the last-but-one flow is left out in reverse
        latents = noise * self.noise_scale_duration
        for flow in flows:
            latents = torch.flip(latents, [1])
            if hasattr(flow, "num_bins"):  # a VitsConvFlow
                latents = conv_flow_reverse(flow, latents, mask, inputs)
            else:
                latents, _ = flow(latents, mask, global_conditioning=inputs, reverse=True)
        return latents[:, :1]


def conv_flow_reverse(flow: nn.Module, inputs: torch.Tensor, mask: torch.Tensor, conditioning: torch.Tensor) -> torch.Tensor:
    """``VitsConvFlow.forward(..., reverse=True)`` with its spline on every element and ``torch.where`` for the
    identity outside ``tail_bound``, where transformers gathers the elements inside by a boolean mask: a size only
    the data decides, which no delegate takes (the same numbers: an element outside is its input either way)."""
    first, second = torch.split(inputs, [flow.half_channels] * 2, dim=1)
    hidden = flow.conv_pre(first)
    hidden = flow.conv_dds(hidden, mask, conditioning)
    hidden = flow.conv_proj(hidden) * mask
    batch, channels, length = first.shape
    hidden = hidden.reshape(batch, channels, -1, length).permute(0, 1, 3, 2)
    scale = math.sqrt(flow.filter_channels)
    widths = hidden[..., : flow.num_bins] / scale
    heights = hidden[..., flow.num_bins : 2 * flow.num_bins] / scale
    derivatives = hidden[..., 2 * flow.num_bins :]
    bound = flow.tail_bound
    inside = (second >= -bound) & (second <= bound)
    splined = spline_reverse(second.clamp(-bound, bound), widths, heights, derivatives, bound)
    second = torch.where(inside, splined, second)
    return torch.cat([first, second], dim=1) * mask


#: transformers' least bin width, height and derivative of VITS's splines.
LEAST_BIN = 1e-3


def spline_reverse(
    inputs: torch.Tensor, widths: torch.Tensor, heights: torch.Tensor, derivatives: torch.Tensor, bound: float
) -> torch.Tensor:
    """transformers' ``_rational_quadratic_spline(..., reverse=True)`` inside ``[-bound, bound]``, each bin's values
    picked by a one-hot sum where transformers gathers by an int64 bin index (which a Core AI delegate cannot carry:
    it would leave the search and the gathers outside); the same numbers (a sum of one value and zeros)."""
    bins = widths.shape[-1]
    lower, span = -bound, 2 * bound

    def edges(unnormalized: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sizes = LEAST_BIN + (1 - LEAST_BIN * bins) * nn.functional.softmax(unnormalized, dim=-1)
        inner = span * torch.cumsum(sizes, dim=-1)[..., :-1] + lower
        ends = torch.cat([torch.full_like(inner[..., :1], lower), inner, torch.full_like(inner[..., :1], bound)], -1)
        return ends, ends[..., 1:] - ends[..., :-1]

    cumwidths, widths = edges(widths)
    cumheights, heights = edges(heights)
    tail = torch.full_like(derivatives[..., :1], math.log(math.expm1(1 - LEAST_BIN)))
    derivatives = LEAST_BIN + nn.functional.softplus(torch.cat([tail, derivatives, tail], dim=-1))
    locations = torch.cat([cumheights[..., :-1], cumheights[..., -1:] + 1e-6], dim=-1)
    index = (inputs.unsqueeze(-1) >= locations).to(inputs.dtype).sum(-1, keepdim=True) - 1  # [..., 1], a float
    one_hot = (index == torch.arange(bins, dtype=inputs.dtype)).to(inputs.dtype)  # [..., bins]

    def pick(table: torch.Tensor) -> torch.Tensor:
        return (table[..., :bins] * one_hot).sum(-1)

    delta = heights / widths
    input_delta, input_derivatives, input_heights = pick(delta), pick(derivatives), pick(heights)
    intermediate1 = input_derivatives + pick(derivatives[..., 1:]) - 2 * input_delta
    intermediate2 = inputs - pick(cumheights)
    intermediate3 = intermediate2 * intermediate1
    a = input_heights * (input_delta - input_derivatives) + intermediate3
    b = input_heights * input_derivatives - intermediate3
    c = -input_delta * intermediate2
    root = (2 * c) / (-b - torch.sqrt(b.pow(2) - 4 * a * c))
    return root * pick(widths) + pick(cumwidths)


class Frames(nn.Module):
    """Each token's prior over its frames, ``VitsModel``'s flow backwards and its HiFi-GAN decoder: the waveform."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        check_model(model)
        self.flow = model.flow
        self.decoder = model.decoder
        self.noise_scale = float(model.noise_scale)

    def forward(self, durations, prior_means, prior_log_variances, noise):
        frames = torch.arange(noise.shape[-1], dtype=durations.dtype).unsqueeze(0)  # [1, F]
        ends = torch.cumsum(durations, -1).unsqueeze(-1)  # [1, T, 1]
        # token t covers frames [end of t - 1, end of t): as VitsModel's path, a difference of two prefixes
        covered = (frames < ends).to(prior_means.dtype)  # [1, T, F]
        path = covered - nn.functional.pad(covered, [0, 0, 1, 0])[:, :-1]
        means = torch.matmul(path.transpose(1, 2), prior_means).transpose(1, 2)  # [1, C, F]
        log_variances = torch.matmul(path.transpose(1, 2), prior_log_variances).transpose(1, 2)
        latents = means + noise * torch.exp(log_variances) * self.noise_scale
        mask = torch.ones_like(noise[:, :1])
        latents = self.flow(latents, mask, None, reverse=True)
        return self.decoder(latents * mask, None).reshape(1, -1)  # [1, F * hop]; the converter loses the static batch of squeeze(1)


def hop_length(config: Any) -> int:
    """Waveform samples per spectrogram frame: the product of the decoder's upsampling rates."""
    return math.prod(config.upsample_rates)


def reference(model: nn.Module, input_ids: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``VitsModel.forward``'s own waveform ``[samples]`` and per-token durations ``[T]`` at ``seed`` (its noises
    drawn inside): what :func:`synthesize` and :func:`durations_of` give through a ``.pte`` at the same seed."""
    from transformers import set_seed

    seen = []
    hook = model.duration_predictor.register_forward_hook(lambda module, args, out: seen.append(out))
    try:
        with torch.no_grad():
            set_seed(seed)
            waveform = model(torch.tensor([list(input_ids)])).waveform[0]
    finally:
        hook.remove()
    return waveform, torch.ceil(torch.exp(seen[0]) / model.speaking_rate)[0, 0]


def lower_vits(
    model: nn.Module, *, max_tokens: int = 256, max_frames: int = 4096, device: bool = False, **partitioner_options: Any
):
    """Both methods lowered to one ``.pte`` (one asset, :func:`~coreai_partitioner.lowering.methods.lower_method_modules`),
    ``T`` fixed at ``max_tokens`` and ``F`` from 1 to ``max_frames``, in the host form or (``device``) the form
    upstream's on-device runtime runs, every delegate checked against its contract (a size at most the waveform's
    ``max_frames * hop``); the ``EdgeProgramManager``.

    Constant methods tell the loop what it needs: ``get_family`` (1), ``get_sampling_rate``, ``get_hop_length``,
    ``get_noise_channels`` (C), ``get_max_tokens``, ``get_max_frames``, ``get_duration_noise`` (1 where the
    duration predictor is the stochastic one, which draws noise).
    """
    from coreai_partitioner.lowering.methods import lower_method_modules

    check_model(model)
    config = model.config
    channels = config.flow_size
    if max_tokens < 1 or max_frames < 5:
        raise UnsupportedVits(f"vits: max_tokens={max_tokens}, max_frames={max_frames}; give at least 1 and 5")
    frames_dim = torch.export.Dim("F", min=1, max=max_frames)
    samples = {
        "durations": (
            torch.ones(1, max_tokens, dtype=torch.long), torch.ones(1, max_tokens, dtype=torch.long),
            torch.zeros(1, 2, max_tokens),
        ),
        "decoder": (
            torch.ones(1, max_tokens), torch.zeros(1, max_tokens, channels), torch.zeros(1, max_tokens, channels),
            torch.zeros(1, channels, 4),
        ),
    }
    dynamic_shapes = {"durations": None, "decoder": (None, None, None, {2: frames_dim})}
    constants = {
        "get_family": CODE,
        "get_sampling_rate": int(config.sampling_rate),
        "get_hop_length": hop_length(config),
        "get_noise_channels": channels,
        "get_max_tokens": max_tokens,
        "get_max_frames": max_frames,
        "get_duration_noise": int(bool(config.use_stochastic_duration_prediction)),  # whether VitsModel draws it
    }
    modules = {"durations": Durations(model, device).eval(), "decoder": Frames(model).eval()}
    return lower_method_modules(
        modules, samples, device=device, constant_methods=constants, dynamic_shapes=dynamic_shapes,
        bounded=max_frames * hop_length(config) if device else None, **partitioner_options,
    )


def _durations_call(program: SpeechProgram, ids: torch.Tensor, seed: int) -> list[torch.Tensor]:
    """``durations`` on ``ids`` padded to the program's length, its noise the first ``VitsModel.forward`` draws at
    ``seed``; the generator left where ``VitsModel`` leaves it before its second draw."""
    count, most = ids.shape[1], program.constant("get_max_tokens")
    if not 1 <= count <= most:
        raise ValueError(f"{count} token id(s); {program.path} takes 1 to {most}: export it with a larger --max-tokens")
    torch.manual_seed(seed)
    # VitsModel's deterministic duration predictor draws nothing; the stochastic one draws first
    duration_noise = torch.randn(1, 2, count) if program.constant("get_duration_noise") else torch.zeros(1, 2, count)
    padded = (0, most - count)
    inputs = (
        nn.functional.pad(ids, padded), nn.functional.pad(torch.ones_like(ids), padded),
        nn.functional.pad(duration_noise, padded),
    )
    return program.run("durations", *inputs)


def durations_of(program: SpeechProgram, input_ids: list[int] | torch.Tensor, *, seed: int = 0) -> torch.Tensor:
    """Each token's duration in spectrogram frames (``[T]``), as ``VitsModel`` predicts it at ``seed``."""
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1)
    return _durations_call(program, ids, seed)[0][0, : ids.shape[1]]


def synthesize(program: SpeechProgram, input_ids: list[int] | torch.Tensor, *, seed: int = 0) -> torch.Tensor:
    """The waveform ``[samples]`` of ``input_ids`` through ``program``.

    The noises are drawn from ``torch.manual_seed(seed)`` in ``VitsModel.forward``'s order, so the waveform is the one
    ``transformers.set_seed(seed); model(input_ids)`` gives (and the same ``seed`` the same speech).
    """
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1)
    durations, means, log_variances = _durations_call(program, ids, seed)
    frames = max(1, int(durations.sum()))
    max_frames = program.constant("get_max_frames")
    if frames > max_frames:
        raise ValueError(
            f"the durations add up to {frames} frames; {program.path} decodes at most {max_frames}: export it with a "
            "larger --max-frames, or give fewer tokens"
        )
    # as VitsModel draws it: randn_like of its prior, a transposed [1, F, C] (torch fills a strided tensor element by
    # element, other numbers than a contiguous one's from the same seed)
    noise = torch.randn_like(torch.empty(1, frames, program.constant("get_noise_channels")).transpose(1, 2))
    return program.run("decoder", durations, means, log_variances, noise)[0][0]


# ---------------------------------------------------------------- the family, as the export command asks it


def is_checkpoint(directory: Path) -> bool:
    """Never by its files: a VITS checkpoint's ``config.json`` says it (``model_type`` ``vits``)."""
    return False


def load_config(checkpoint: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(checkpoint, local_files_only=True)


def load_model(checkpoint: Path, config: Any, dtype: torch.dtype) -> nn.Module:
    from transformers import VitsModel

    return VitsModel.from_pretrained(checkpoint, config=config, dtype=dtype, local_files_only=True).eval()


def tiny_config() -> Any:
    """Two layers, a stochastic duration predictor, MMS-TTS's shape of everything else at a few channels."""
    from transformers import VitsConfig

    return VitsConfig(
        vocab_size=12, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, window_size=2, ffn_dim=8,
        flow_size=4, spectrogram_bins=5, upsample_initial_channel=8, upsample_rates=[2, 2], upsample_kernel_sizes=[4, 4],
        resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1]], prior_encoder_num_flows=2,
        prior_encoder_num_wavenet_layers=1, posterior_encoder_num_wavenet_layers=1, duration_predictor_num_flows=2,
        duration_predictor_filter_channels=8, depth_separable_num_layers=1, duration_predictor_flow_bins=2,
        sampling_rate=16000, architectures=["VitsModel"],
    )


def tiny_model(config: Any) -> nn.Module:
    from transformers import VitsModel

    return VitsModel(config).eval()


def limits(config: Any, max_tokens: int | None, max_frames: int | None) -> tuple[int, int]:
    """A single-speaker config; the flags' limits, at least 1 token and 5 frames."""
    check_config(config)
    tokens = LIMITS[0] if max_tokens is None else max_tokens
    frames = LIMITS[1] if max_frames is None else max_frames
    if tokens < 1 or frames < 5:
        raise UnsupportedVits(f"--max-tokens {tokens} --max-frames {frames}: give at least 1 and 5")
    return tokens, frames


def methods(config: Any, max_tokens: int, max_frames: int) -> list[str]:
    return [
        f"durations(input_ids [1, {max_tokens}], attention_mask, duration_noise [1, 2, {max_tokens}])",
        f"decoder(durations, prior_means, prior_log_variances, noise [1, {config.flow_size}, F <= {max_frames}]) "
        f"-> waveform [1, F * {hop_length(config)}]",
    ]


def layers(config: Any) -> str:
    return f"{config.num_hidden_layers} text-encoder layer(s)"


def seeded_reference(model: nn.Module, config: Any, max_tokens: int) -> SpeechReference:
    """Seeded random ids (at most 16) through the model at seed 0."""
    from coreai_partitioner.text_to_speech.program import SpeechReference

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (min(max_tokens, 16),), generator=generator).tolist()
    return SpeechReference(ids, 0, *reference(model, ids, seed=0))


def lower(model: nn.Module, **options: Any):
    return lower_vits(model, **options)


def replay(program: SpeechProgram, verified: SpeechReference) -> tuple[torch.Tensor, torch.Tensor]:
    return durations_of(program, verified.ids, seed=verified.seed), synthesize(program, verified.ids, seed=verified.seed)


def speak(program: SpeechProgram, ids: list[int], *, voice: Path | None, speed: float, seed: int) -> torch.Tensor:
    if voice is not None or speed != 1.0:
        raise ValueError(f"{program.path} is a VITS program, which has one voice and speed: leave out --voice and --speed")
    return synthesize(program, ids, seed=seed)
