"""A text decoder fed embeddings by other methods: what every task for ExecuTorch's ``MultimodalRunner`` shares.

The runner (``extension/llm/runner/multimodal_prefiller.cpp``) feeds a prompt
segment by segment, each segment one ``text_decoder`` call:

* a text segment: ``token_embedding(tokens [1, n] int64) -> [1, n, D]``;
* a segment of another modality: its encoder method (``vision_encoder``,
  ``audio_encoder``) over what the app hands the runner -> ``[1, N, D]``;
* then ``text_decoder(embeddings [1, S, D], positions [S] int64) -> logits
  [1, 1, vocab]`` (the last position's), positions ``arange(start, start + S)``;
* a decode step: ``token_embedding([[token]])`` then ``text_decoder`` at one position.

The runner converts no dtype between them and never reads ``D``.  What each
modality's room adds is its encoder method; the rest is here:

- :class:`TextModel`: a multimodal model's text half as :func:`~.adapter.adapt` reads a causal LM;
- :class:`EmbeddedDecoder`: ``token_embedding`` and ``text_decoder`` over a
  :class:`~.decoder.Decoder` (a room's model subclasses it and adds its
  encoder); :class:`DeviceEmbeddedDecoder`, their device form;
- :func:`export_methods`: each method exported from one module tree, composites externalized;
- :class:`Methods`, :func:`greedy`: the methods called the runner's way, eager or lowered;
  :func:`generate`: ExecuTorch's own ``MultimodalRunner`` on a ``.pte``;
- :func:`tiny_tokenizer`: a tokenizer of one character per token for the rooms' tiny processors.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from coreai_partitioner.blocks import Step
from coreai_partitioner.text_decoder.decoder import Decoder


class TextModel(nn.Module):
    """A multimodal model's text half as :func:`coreai_partitioner.text_decoder.adapt` reads a causal LM.

    ``config`` is the text config, ``model`` the decoder stack (``embed_tokens``,
    ``layers``, ``norm``, ``rotary_emb``) and ``lm_head`` the head: the HF
    model's own modules, nothing copied.
    """

    def __init__(self, config, model: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.config = config
        self.model = model
        self.lm_head = lm_head

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype


class EmbeddedDecoder(nn.Module):
    """``token_embedding`` and ``text_decoder`` over a :class:`~coreai_partitioner.text_decoder.Decoder`; a room's
    model adds its encoder method."""

    #: Whether the embeddings carry a flag channel after the decoder's width (:meth:`decoder_input`): a family that
    #: must tell an encoder's embeddings from text's (Gemma 3's images attend each other both ways).
    flagged = False

    def __init__(self, *, model_type: str, decoder: Decoder) -> None:
        super().__init__()
        self.model_type = model_type
        self.decoder = decoder

    @property
    def width(self) -> int:
        """The width ``D`` of what the encoder and ``token_embedding`` return (with the flag channel)."""
        return self.decoder.embed.weight.shape[1] + (1 if self.flagged else 0)

    def token_embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[1, n]`` int64 -> ``[1, n, D]``: the decoder's embedding, scaled where the family scales it."""
        return self.flag(self.decoder.embedding(tokens), encoded=False)

    def text_decoder(self, embeddings: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``[1, S, D]`` at ``positions`` ``[S]`` -> the last position's logits ``[1, 1, vocab]``; writes the caches."""
        hidden, step = self.decoder_input(embeddings, positions)
        return self.decoder.run_embedded(hidden, step)

    def flag(self, embeddings: torch.Tensor, *, encoded: bool) -> torch.Tensor:
        """``embeddings`` as the decoder takes them: as they are, unless the family flags an encoder's (:attr:`flagged`)."""
        if not self.flagged:
            return embeddings
        flag = torch.full_like(embeddings[..., :1], 1.0 if encoded else 0.0)
        return torch.cat([embeddings, flag], dim=-1)

    def decoder_input(self, embeddings: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, Step]:
        """The decoder's hidden state and the call's :class:`~coreai_partitioner.blocks.Step`."""
        hidden, encoded = self.split_flag(embeddings)
        return hidden, self.step(positions, encoded)

    def split_flag(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The decoder's hidden state, and which tokens are an encoder's (``[S]`` bool) where the family flags them."""
        if not self.flagged:
            return embeddings, None
        return embeddings[..., :-1], embeddings[0, :, -1] > 0.5

    def step(self, positions: torch.Tensor, encoded: torch.Tensor | None) -> Step:
        """The host form's step (caches the delegate's state); ``encoded`` says which tokens are an encoder's."""
        return Step(self.decoder, positions)

    def device_step(self, positions: torch.Tensor, slots: torch.Tensor, encoded: torch.Tensor | None) -> Step:
        """The device form's step (:class:`~coreai_partitioner.text_decoder.device.DeviceStep`: caches the program's, written
        by row at ``slots``, the int64 positions; ``positions`` are their fp32 copy)."""
        from coreai_partitioner.text_decoder.device import DeviceStep

        return DeviceStep(self.decoder, positions, slots)


class DeviceEmbeddedDecoder(nn.Module):
    """The device form's ``token_embedding`` and ``text_decoder`` over an :class:`EmbeddedDecoder` (upstream's
    on-device runtime: fp16/fp32 tensor arguments only, the caches the program's own).

    ``token_embedding`` takes the runner's int64 tokens ``[1, n]``; the program
    casts them to fp32 before the delegate, which casts them back to int32 for
    the gather.  ``text_decoder`` takes the runner's int64 positions, cast to
    fp32 before the delegate; the caches are read whole and written by row
    outside it (:class:`~coreai_partitioner.text_decoder.device.DeviceStep`).
    A room's device form adds its encoder method, the host form's.
    """

    def __init__(self, model: EmbeddedDecoder) -> None:
        super().__init__()
        self.model = model

    @property
    def width(self) -> int:
        return self.model.width

    def token_embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        from coreai_partitioner.partition.boundaries import outside_delegate

        with outside_delegate():
            tokens = tokens.to(torch.float32)
        return self.model.token_embedding(tokens.to(torch.int32))

    def text_decoder(self, embeddings: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        from coreai_partitioner.partition.boundaries import outside_delegate

        with outside_delegate():
            floats = positions.to(torch.float32)
        hidden, encoded = self.model.split_flag(embeddings)
        return self.model.decoder.run_embedded(hidden, self.model.device_step(floats, positions, encoded))


class Method(nn.Module):
    """One method of a model as a module's ``forward``.

    Every method is exported from the same module tree (``model.``), so a
    weight has one name in every method's program and the shared asset
    stores it once.
    """

    def __init__(self, model: nn.Module, method: str) -> None:
        super().__init__()
        self.model = model
        self.method = method

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` the method's input (an encoder's, tokens, embeddings); ``positions`` the text decoder's."""
        inputs = (x,) if positions is None else (x, positions)
        return getattr(self.model, self.method)(*inputs)


def text_samples(model: EmbeddedDecoder, prefill_chunk: int) -> dict[str, tuple[tuple[torch.Tensor, ...], Any]]:
    """``token_embedding``'s and ``text_decoder``'s sample inputs and dynamic shapes: ``n`` and ``S`` from 1 to the chunk."""
    length = min(2, prefill_chunk)
    tokens = torch.zeros(1, length, dtype=torch.long)
    embeddings = torch.zeros(1, length, model.width, dtype=model.decoder.dtype)
    positions = torch.arange(length)
    if prefill_chunk > 1:
        n = torch.export.Dim("n", min=1, max=prefill_chunk)
        s = torch.export.Dim("S", min=1, max=prefill_chunk)
        token_dims, decoder_dims = ({1: n},), ({1: s}, {0: s})
    else:
        token_dims = decoder_dims = None
    return {"token_embedding": ((tokens,), token_dims), "text_decoder": ((embeddings, positions), decoder_dims)}


def export_methods(
    methods: nn.Module,
    samples: dict[str, tuple[tuple[torch.Tensor, ...], Any]],
    *,
    device: bool,
    decompositions: dict | None = None,
    quantize: Any = None,
    keep_float: Sequence[str] = (),
) -> dict[str, tuple]:
    """``{method: (exported_program, records)}``: each of ``samples``' methods of ``methods`` exported with its
    composites externalized, from one module tree (:class:`Method`).

    ``keep_float`` names the layers (from ``methods``) ``quantize`` leaves
    float; each method's program is quantized by the same scheme, so a
    weight two methods read is the same compressed tensor in both, stored
    once.  ``device`` keeps the device form's boundary annotations.
    """
    from coreai_partitioner.lowering.lower import export_with_composites

    exported = {}
    for method, (sample, dims) in samples.items():
        with warnings.catch_warnings():
            # Each method calls some of the model's composites: the others have no call site in its program, by design.
            warnings.filterwarnings("ignore", message="No call sites found for externalized submodule")
            exported[method] = export_with_composites(
                Method(methods, method), sample, dynamic_shapes=dims, quantize=quantize,
                keep_float=["model." + path for path in keep_float], decompositions=decompositions, annotations=device,
            )
    return exported


def lower_embedded(
    model: EmbeddedDecoder,
    shapes: Any,
    export: Callable[[dict], dict[str, tuple]],
    *,
    constant_methods: dict[str, Any],
    quantize: Any = None,
    quantized_reference: dict | None = None,
    **partitioner_options: Any,
):
    """A room's methods lowered in one ``to_backend`` call to one Core AI asset, ``constant_methods`` beside them.

    ``export(decompositions)`` is the room's ``{method: (program, records)}``.
    The caches are emptied first (eager calls before would ship their values
    as the delegate's initial state); the device form's limits are checked
    before any work.  A dict passed as ``quantized_reference`` gets, under
    ``quantize``, each method's quantized eager program.
    """
    from coreai_partitioner.lowering.methods import lower_methods
    from coreai_partitioner.lowering.whole_program import decomposition_table
    from coreai_partitioner.text_decoder.decoder import reset_state
    from coreai_partitioner.text_decoder.device import check_device

    reset_state(model)
    if shapes.device:
        check_device(model.decoder, shapes.prefill_chunk)

    def exported():
        methods = export(decomposition_table())
        if quantize and quantized_reference is not None:
            quantized_reference.update({method: program.module() for method, (program, _) in methods.items()})
        yield from methods.items()

    return lower_methods(
        exported(), device=shapes.device, constant_methods=constant_methods, bounded=shapes.prefill_chunk, **partitioner_options
    )


class Segment(Protocol):
    """One runner input: text ``tokens``, or an ``encoder`` method's ``encoder_input`` (with its batch dimension)."""

    tokens: tuple[int, ...]

    @property
    def encoder(self) -> str | None: ...

    def encoder_input(self) -> torch.Tensor: ...


def split_prompt(
    ids: Sequence[int], items: Sequence[Any], token_id: int, run: int, *, what: str, source: str, error: type[Exception]
) -> list[tuple[int, ...] | Any]:
    """A prompt's ids cut where ``items`` (an encoder's inputs, in order) go: text (a tuple of ids) between items,
    an item for each run of ``run`` placeholders ``token_id``.

    Refused with ``error``: a run of placeholders that is not a whole ``what``,
    and more or fewer runs than ``items`` (``source`` names where they came from).
    """
    pieces: list[tuple[int, ...] | Any] = []
    text: list[int] = []
    index = used = 0
    while index < len(ids):
        if ids[index] != token_id:
            text.append(ids[index])
            index += 1
            continue
        placeholders = ids[index : index + run]
        if len(placeholders) < run or any(t != token_id for t in placeholders):
            raise error(f"a run of {what} placeholders at token {index} is not a whole {what} of {run} tokens")
        if used == len(items):
            raise error(f"the prompt places more of {what} than {source} holds ({len(items)})")
        if text:
            pieces.append(tuple(text))
            text = []
        pieces.append(items[used])
        used += 1
        index += run
    if text:
        pieces.append(tuple(text))
    if used != len(items):
        raise error(f"{source} holds {len(items)} of {what} and the prompt places {used}")
    return pieces


class Methods:
    """The methods of one program, called by name: ``call(method, *inputs) -> first output``."""

    def __init__(self, call: Callable[..., torch.Tensor], reset: Callable[[], None] = lambda: None) -> None:
        self.call = call
        self.reset = reset

    @classmethod
    def of(cls, program: Any) -> Methods:
        """The methods of an eager :class:`EmbeddedDecoder`; of a quantized eager program (the
        ``{method: GraphModule}`` a room's lowering fills under ``quantized_reference``, its weights expanded once,
        in copies); of a lowered program (``EdgeProgramManager`` or its ``to_executorch()``) or a ``.pte`` (path or
        bytes), run in ExecuTorch's runtime."""
        from coreai_partitioner.text_decoder.decoder import reset_state

        if isinstance(program, dict):
            import copy

            from coreai_partitioner.quantize.weight_forms import expand_weights

            modules = {method: expand_weights(copy.deepcopy(module)) for method, module in program.items()}

            def quantized(method: str, *inputs: torch.Tensor) -> torch.Tensor:
                with torch.no_grad():
                    return modules[method](*inputs)

            def reset() -> None:
                for module in modules.values():
                    reset_state(module)

            return cls(quantized, reset)
        if isinstance(program, EmbeddedDecoder):

            def eager(method: str, *inputs: torch.Tensor) -> torch.Tensor:
                with torch.no_grad():
                    return getattr(program, method)(*inputs)

            return cls(eager, lambda: reset_state(program))
        from coreai_partitioner import verify

        return cls(lambda method, *inputs: verify.run(program, *inputs, method=method)[0], lambda: verify.reset_state(program))


def prefill(methods: Methods, segment: Segment, position: int) -> tuple[torch.Tensor, int]:
    """One segment's ``text_decoder`` call at ``position``: its logits and the next position."""
    if segment.encoder is not None:
        embedded = methods.call(segment.encoder, segment.encoder_input())
    else:
        embedded = methods.call("token_embedding", torch.tensor([segment.tokens]))
    length = embedded.shape[1]
    return methods.call("text_decoder", embedded, torch.arange(position, position + length)), position + length


def greedy(program: Any, segments: Sequence[Segment], new_tokens: int, eos_ids: Sequence[int] = ()) -> list[int]:
    """The new tokens ``program`` generates greedily after ``segments``, as ``MultimodalRunner`` calls it.

    Each segment is one ``text_decoder`` call at the next positions; each new
    token is ``token_embedding`` then ``text_decoder`` at one position.
    Stops after an EOS id.
    """
    methods = program if isinstance(program, Methods) else Methods.of(program)
    methods.reset()
    position = 0
    logits = None
    for segment in segments:
        logits, position = prefill(methods, segment, position)
    tokens: list[int] = []
    for _ in range(new_tokens):
        token = int(logits.reshape(-1, logits.shape[-1])[-1].argmax())
        tokens.append(token)
        if token in eos_ids:
            break
        embedded = methods.call("token_embedding", torch.tensor([[token]]))
        logits = methods.call("text_decoder", embedded, torch.tensor([position]))
        position += 1
    return tokens


def generate(pte: str | os.PathLike, tokenizer: str | os.PathLike, inputs: Callable[[Any], list], new_tokens: int) -> list[str]:
    """ExecuTorch's own ``MultimodalRunner`` on ``pte`` (Core AI delegates on the host backend; with the ``.ptd``
    beside it, if any): its greedy output after ``inputs(runner)`` (``runner`` is
    ``executorch.extension.llm.runner``, whose ``make_*_input`` make them), one piece per generated token, the
    first being the prefill's."""
    from coreai_partitioner.backends.apple_coreai.runtime.host import load_runtime_backend
    from coreai_partitioner.backends.apple_coreai.runtime.pte import data_file_of
    from coreai_partitioner.console import NativeStreams

    with NativeStreams():
        from executorch.extension.llm import runner as llm_runner

    load_runtime_backend()
    made = inputs(llm_runner)
    pieces: list[str] = []
    streams = NativeStreams()
    try:
        with streams:
            data = data_file_of(pte)  # a program lowered with external_data runs with its .ptd
            paths = (str(pte), str(tokenizer)) + ((str(data),) if data else ())
            runner = llm_runner.MultimodalRunner(*paths)
            config = llm_runner.GenerationConfig(max_new_tokens=new_tokens, temperature=0.0, echo=False)
            runner.generate(made, config, pieces.append)
    except RuntimeError as error:
        raise RuntimeError(f"MultimodalRunner failed on {Path(pte).name}: {error}\n{streams.tail()}") from error
    return pieces


def characters() -> list[str]:
    """Token ``i`` of the tiny vocabulary: one printable character (ASCII and newline as themselves, the rest from U+0100)."""
    return [chr(i) if 32 <= i < 127 or i == 10 else chr(0x100 + i) for i in range(256)]


def tiny_tokenizer(config: Any, special: dict[int, str], **named: str) -> Any:
    """A ``PreTrainedTokenizerFast`` of one character per token, its ids ``special`` (id -> text) whole special tokens.

    ``named`` gives the tokenizer's named special tokens (``image_token="<image>"``),
    which the processors read.  ``tokenizer.backend_tokenizer.save(path)``
    writes the ``tokenizer.json`` ExecuTorch's runner loads.
    """
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    text = config.get_text_config()
    vocab = characters()
    for index, content in special.items():
        vocab[index] = content
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(vocab)}, merges=[], unk_token=vocab[0]))
    backend.decoder = decoders.Fuse()
    ends = {"bos_token": text.bos_token_id, "eos_token": text.eos_token_id, "pad_token": text.pad_token_id}
    backend.add_special_tokens([vocab[i] for i in ends.values() if isinstance(i, int)] + list(special.values()))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        **{name: vocab[i] for name, i in ends.items() if isinstance(i, int)},
        extra_special_tokens=named,
    )
