"""A lowered vision-language program against the model it was lowered from: image embeddings, prefill logits, greedy tokens.

What ``export --verify`` runs for an ``image-text-to-text`` checkpoint, in two
halves, so that the fp32 model can be gone before the model to export is loaded:

1. :func:`reference`: the fp32 model over a processor's prompt (text, an
   image, text): each image's projected features (``get_image_features``'
   ``pooler_output``), its greedy continuation (``generate``, up to its own
   EOS) and its logits after the prompt and after each of those tokens.
2. :func:`check`: the program fed as ``MultimodalRunner`` feeds it (a
   ``text_decoder`` call per segment, then the reference's tokens one a
   call, :mod:`.run`), its image embeddings and logits judged against the
   eager model it was lowered from (the fp32 model; the model at its dtype;
   the quantized eager methods :func:`~.export.lower_vlm` hands back, fed
   the same way by :func:`program_outputs`) at the runtime's own tolerance
   for its dtype and the model's shape
   (:func:`coreai_partitioner.verify.fidelity.runtime_threshold`), its top-1
   at each step against the eager model's, near-ties allowed.  Its distance
   from the fp32 model is a report beside it (:func:`~coreai_partitioner.verify.fidelity.quality`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from coreai_partitioner.verify import fidelity
from coreai_partitioner.image_text_to_text.run import Methods, Segment, prefill, runner_inputs

#: Greedy tokens compared.
NEW_TOKENS = 8


@dataclass(frozen=True)
class Reference:
    """What the fp32 model says over one prompt with images."""

    segments: list[Segment]
    features: list[torch.Tensor]  # each image's embeddings [image_tokens, D]
    tokens: list[int]  # greedy new tokens; the last may be an EOS id
    logits: torch.Tensor  # [len(tokens), vocab]: after the prompt, then after each token but the last
    width: int  # the longest reduction of its matmuls: its widest Linear's inputs, or the tower's attention over patches
    depth: int  # the stages whose rounding adds up: the tower's layers, the projector, the decoder's layers, the head

    def threshold(self, dtype: torch.dtype | str) -> fidelity.Threshold:
        """The runtime's tolerance for a program of this model at ``dtype`` (:func:`fidelity.runtime_threshold`)."""
        return fidelity.runtime_threshold(dtype, width=self.width, depth=self.depth)


def reference(model: torch.nn.Module, processed: Any, image_token_id: int, image_tokens: int, new_tokens: int = NEW_TOKENS) -> Reference:
    """The :class:`Reference` of the fp32 HF ``model`` over ``processed`` (its processor's output, batch 1)."""
    from coreai_partitioner.verify.fidelity import width_of

    inputs = dict(processed)
    images = {k: v for k, v in inputs.items() if k in ("pixel_values", "pixel_attention_mask")}
    generation = model.generation_config
    eos = generation.eos_token_id
    pad = generation.pad_token_id if generation.pad_token_id is not None else (eos if isinstance(eos, int) else 0)
    with torch.no_grad():
        pooled = model.get_image_features(**images).pooler_output
        features = list(pooled) if isinstance(pooled, (list, tuple)) else list(pooled.reshape(-1, image_tokens, pooled.shape[-1]))
        features = [f.reshape(-1, image_tokens, f.shape[-1]) for f in features]
        features = [image.float() for batch in features for image in batch]
        length = inputs["input_ids"].shape[1]
        out = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
        tokens = out[0, length:].tolist()
        extended = _extended(inputs, tokens[:-1])
        logits = model(**extended).logits[0, length - 1 :].float()
    config, vision = model.config, model.config.vision_config
    patches = (vision.image_size // vision.patch_size) ** 2  # what the tower's attention reduces over
    depth = vision.num_hidden_layers + config.get_text_config().num_hidden_layers + 2
    segments = runner_inputs(processed, image_token_id, image_tokens)
    return Reference(segments, features, tokens, logits, max(width_of(model), patches), depth)


def _extended(inputs: dict[str, Any], tokens: list[int]) -> dict[str, Any]:
    """The processor's inputs with ``tokens`` after the prompt (text tokens: attended, not an image's)."""
    extra = torch.tensor([tokens], dtype=inputs["input_ids"].dtype)
    extended = dict(inputs)
    extended["input_ids"] = torch.cat([inputs["input_ids"], extra], 1)
    for key in ("attention_mask", "token_type_ids"):
        if key in inputs:
            fill = torch.ones_like(extra) if key == "attention_mask" else torch.zeros_like(extra)
            extended[key] = torch.cat([inputs[key], fill.to(inputs[key].dtype)], 1)
    return extended


def program_outputs(program: Any, reference: Reference) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The program's image embeddings (each ``[image_tokens, D]``, a flag channel left out) and its logits where
    :attr:`Reference.logits` are, fed as the runner feeds it.  ``program`` is what :meth:`.run.Methods.of` takes."""
    methods = program if isinstance(program, Methods) else Methods.of(program)
    methods.reset()
    width = reference.features[0].shape[-1] if reference.features else None
    features = [
        methods.call("vision_encoder", s.pixels.unsqueeze(0))[0, :, :width].float() for s in reference.segments if s.is_image
    ]
    methods.reset()
    position = 0
    for segment in reference.segments:
        logits, position = prefill(methods, segment, position)
    rows = [logits.reshape(-1, logits.shape[-1])[-1:]]
    for token in reference.tokens[:-1]:
        embedded = methods.call("token_embedding", torch.tensor([[token]]))
        logits = methods.call("text_decoder", embedded, torch.tensor([position]))
        rows.append(logits.reshape(-1, logits.shape[-1])[-1:])
        position += 1
    return features, torch.cat(rows).float()


@dataclass(frozen=True)
class VisionReport:
    """A lowered vision-language program's image embeddings, logits and greedy tokens against the eager model it
    was lowered from (:attr:`against` says which), the fp32 model's distance beside them."""

    reference: Reference
    picked: list[int]
    eager_picked: list[int]
    features: fidelity.SignalReport
    logits: fidelity.SignalReport
    quality: fidelity.Quality  # the logits against the fp32 model's: a report
    against: str

    @property
    def ok(self) -> bool:
        return self.features.ok and self.logits.ok

    def __str__(self) -> str:
        ref = self.reference
        images = sum(s.is_image for s in ref.segments)
        return "\n".join(
            [
                f"verify: a prompt of {len(ref.segments)} segment(s), {images} of them image(s), one text_decoder call "
                f"each, then the fp32 model's {len(ref.tokens) - 1} greedy token(s) one a call",
                f"image embeddings (vision_encoder) against {self.against}'s, each at unit RMS:",
                str(self.features),
                f"logits after the prompt and after each token against {self.against}:",
                str(self.logits),
                f"\ngreedy tokens (each step's top-1, the fp32 model's tokens fed back):\n  .pte : {self.picked}\n"
                f"  eager: {self.eager_picked}\n  fp32 : {ref.tokens}" + ("\n  same" if self.picked == ref.tokens else ""),
                f"logits against the fp32 model (a report): {self.quality}",
            ]
        )

    def raise_for_mismatch(self) -> None:
        if not self.ok:
            raise AssertionError(f"the lowered program is not close enough to {self.against}:\n" + str(self))


def check(
    program: Any,
    reference: Reference,
    *,
    eager: tuple[list[torch.Tensor], torch.Tensor] | None = None,
    dtype: torch.dtype | str = torch.float32,
    quantize: str | None = None,
    threshold: fidelity.Threshold | None = None,
) -> VisionReport:
    """Run ``program`` as the runner does over ``reference``'s prompt and judge it against ``eager``.

    ``eager`` is :func:`program_outputs` of the eager model the program was
    lowered from: ``Methods.of`` the model at its dtype, or the quantized
    eager methods ``lower_vlm(..., quantized_reference=)`` hands back.  An
    fp32 program of the fp32 model may leave it out: the reference is its
    eager model's.  ``dtype`` and ``quantize`` are what the program was
    lowered with; the tolerance is the runtime's at ``dtype``
    (:meth:`Reference.threshold`) unless ``threshold`` is given.
    """
    precision = fidelity.precision_name(dtype, quantize)
    how = "program_outputs of Methods.of the model at its dtype, or of lower_vlm's quantized_reference"
    eager_features, eager_logits = fidelity.against(eager, (reference.features, reference.logits), dtype, quantize, how=how)
    if threshold is None:
        threshold = reference.threshold(dtype)
    arithmetic = fidelity.arithmetic(dtype, width=reference.width, depth=reference.depth)
    features, logits = program_outputs(program, reference)
    # At unit RMS: SNR is a ratio, but fidelity's regularizers (1e-5 of signal power) are sized for values near 1,
    # and a tiny random model's features are far smaller.
    scales = [e.pow(2).mean().sqrt().clamp_min(1e-30) for e in eager_features]
    against = ("the quantized eager model" if quantize else "the eager model") + f" ({precision})"
    return VisionReport(
        reference,
        logits.argmax(-1).tolist(),
        eager_logits.argmax(-1).tolist(),
        fidelity.compare(
            [a / s for a, s in zip(features, scales)], [e / s for e, s in zip(eager_features, scales)], threshold,
            precision=arithmetic,
        ),
        fidelity.compare([logits], [eager_logits], threshold, logits=True, precision=arithmetic),
        fidelity.quality(logits, reference.logits),
        against,
    )
