"""A checkpoint's weights left in its safetensors files until something reads them, never held in floating point all
at once.

A model loaded from safetensors in the checkpoint's own dtype holds views of
the memory-mapped files: no weight is read until something reads it.  Its
export would read every weight in the export's dtype (a copy of the whole
model when the dtypes differ).  :func:`stream_weights` swaps each weight
named for a fake tensor of the export's dtype (its shape, no data:
``torch.export`` traces it as a parameter) that knows where it lies in the
checkpoint (:class:`Place`); :func:`materialize` reads that one tensor
(opening its file, then closing it, so its pages leave the process) and
casts it, and :func:`row_reader` a few of its rows.  ``quantize/`` reads each
weight it compresses so (:mod:`coreai_partitioner.quantize.streamed`), and
:func:`read_while_running` runs the model a module at a time, each weight
read while its module runs.

What is not named (norms, biases, MoE experts, a weight ``keep_float``
names) is loaded as before.  An eager run of a model whose weights are fakes
needs :func:`read_while_running`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner import _compat
from coreai_partitioner.checkpoints.files import checkpoint_files

#: The attribute of a fake weight :func:`stream_weights` made that holds its :class:`Place`.
PLACE = "checkpoint_place"


@dataclass(frozen=True)
class Place:
    """Where a weight lies in a safetensors checkpoint, and the dtype it is read in."""

    path: Path
    key: str
    dtype: torch.dtype

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of its dim 0, cast, the file opened for them alone (its pages leave the process with
        them)."""
        from safetensors import safe_open

        with safe_open(str(self.path), "pt") as file:
            return file.get_slice(self.key)[start:stop].to(self.dtype)


def load_lazily(
    auto: Any, checkpoint: Path, config: Any, dtype: torch.dtype, names: Callable[[torch.nn.Module], Iterable[str]] | None = None
) -> torch.nn.Module:
    """``auto.from_pretrained(checkpoint, dtype=dtype)``'s model, each weight ``names(model)`` gives left in the
    checkpoint (:func:`stream_weights`); with no ``names``, every parameter the checkpoint holds, read while its
    module runs under :func:`read_while_running`.

    The model is loaded in the checkpoint's dtype (views of its files: nothing read); each parameter then takes the
    dtype ``from_pretrained(dtype=dtype)`` gives it (``dtype``, or fp32 where the model keeps it so: GPT-OSS's norms)
    and each buffer the value a model made at ``dtype`` has (made in that default dtype: Gemma's embedding scale),
    so that its program is the one a model loaded at ``dtype`` gives, byte for byte.
    """
    model = auto.from_pretrained(
        checkpoint, config=config, dtype="auto", local_files_only=True, attn_implementation="eager"
    ).eval()
    with _parameters_on_meta():
        skeleton = auto.from_config(config, dtype=dtype, attn_implementation="eager")
    kept = _compat.kept_in_fp32(skeleton, dtype)
    made = dict(skeleton.named_parameters(remove_duplicate=False))
    dtypes = {name: torch.float32 if kept(name) else made[name].dtype for name in made}
    stream_weights(model, checkpoint, list(names(model)) if names is not None else list(made), dtypes)
    cast_the_rest(model, dtypes)
    buffers = dict(skeleton.named_buffers())
    for layer, module in model.named_modules():
        own = _compat.module_state(module)[1]
        for name, buffer in list(own.items()):
            twin = buffers.get(f"{layer}.{name}" if layer else name)
            if buffer is not None and twin is not None and twin.shape == buffer.shape:
                own[name] = twin
    return model


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Parameters made inside go to the meta device (no memory, no initialization), buffers are made as usual: a
    model's buffers and its parameters' dtypes without its weights (accelerate's
    ``init_empty_weights(include_buffers=False)``).  Not thread-safe: ``nn.Module.register_parameter`` is swapped
    for the call."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, parameter: torch.nn.Parameter | None) -> None:
        register(module, name, parameter)
        if parameter is not None:
            _compat.module_state(module)[0][name] = torch.nn.Parameter(
                parameter.to("meta"), requires_grad=parameter.requires_grad
            )

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def stream_weights(
    model: torch.nn.Module, checkpoint: Path, names: Iterable[str], dtypes: Mapping[str, torch.dtype]
) -> list[str]:
    """Swap each parameter of ``model`` named in ``names`` (``layer.weight``) whose tensor the checkpoint holds for a
    fake tensor of its dtype in ``dtypes`` (by name), read when :func:`materialize` is asked for it; every name
    swapped.  A tied weight (an lm_head that is the embedding, named once in ``names``) is one fake under every name
    it has."""
    files = checkpoint_files(checkpoint)
    wanted = set(names)
    named = list(model.named_parameters(remove_duplicate=False))
    names_of: dict[int, list[str]] = {}  # every name of each tensor (a tied one has several)
    for name, parameter in named:
        names_of.setdefault(id(parameter), []).append(name)
    fakes: dict[int, torch.nn.Parameter] = {}
    for name, parameter in named:
        if name not in wanted or id(parameter) in fakes:
            continue
        key = next((n for n in names_of[id(parameter)] if n in files), None)
        if key is None:
            continue  # under another name in the checkpoint (a family transformers renames): loaded as it is
        dtype = dtypes[name]
        fake = torch.nn.Parameter(_compat.fake_tensor(parameter.shape, dtype), requires_grad=False)
        setattr(fake, PLACE, Place(files[key], key, dtype))  # the fake carries where its data is
        fakes[id(parameter)] = fake
    done = []
    for layer, module in model.named_modules(remove_duplicate=False):
        own = _compat.module_state(module)[0]
        for attribute, parameter in list(own.items()):
            if parameter is not None and id(parameter) in fakes:  # every name of a tied weight
                own[attribute] = fakes[id(parameter)]
                done.append(f"{layer}.{attribute}" if layer else attribute)
    return done


@contextlib.contextmanager
def read_while_running(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` run eagerly a module at a time: each weight :func:`stream_weights` left in the checkpoint is read
    (and cast) when the module holding it is called, and dropped when the call returns, so the float weights are
    never all held (``export --verify``'s fp32 reference of a checkpoint larger than memory)."""
    handles = []
    held: dict[int, dict[str, torch.nn.Parameter]] = {}  # the fakes of each module running, by id

    def read(module: torch.nn.Module, args: Any) -> None:
        own = _compat.module_state(module)[0]
        fakes = {name: tensor for name, tensor in own.items() if tensor is not None and is_streamed(tensor)}
        held.setdefault(id(module), fakes)
        for name, fake in fakes.items():
            own[name] = torch.nn.Parameter(materialize(fake), requires_grad=False)

    def drop(module: torch.nn.Module, args: Any, output: Any) -> None:
        _compat.module_state(module)[0].update(held.pop(id(module), {}))

    for module in model.modules():
        own = _compat.module_state(module)[0]
        if any(tensor is not None and is_streamed(tensor) for tensor in own.values()):
            handles.append(module.register_forward_pre_hook(read))
            handles.append(module.register_forward_hook(drop, always_call=True))
    try:
        yield model
    finally:
        for handle in handles:
            handle.remove()


def cast_the_rest(model: torch.nn.Module, dtypes: Mapping[str, torch.dtype]) -> None:
    """Every floating parameter of ``model`` that :func:`stream_weights` did not swap cast to its dtype in ``dtypes``
    (by name) in place (``model.to`` cannot swap a fake tensor), a tied one once: the parameters
    ``from_pretrained(dtype=...)`` loads."""
    cast: dict[int, torch.nn.Parameter] = {}
    for layer, module in model.named_modules(remove_duplicate=False):
        own = _compat.module_state(module)[0]
        for name, tensor in list(own.items()):
            dtype = dtypes.get(f"{layer}.{name}" if layer else name)
            if tensor is None or dtype is None or not tensor.is_floating_point() or is_streamed(tensor):
                continue
            if tensor.dtype != dtype and id(tensor) not in cast:
                cast[id(tensor)] = torch.nn.Parameter(tensor.detach().to(dtype), requires_grad=False)
            own[name] = cast.get(id(tensor), tensor)


def place_of(tensor: torch.Tensor) -> Place | None:
    """Where ``tensor`` lies in its checkpoint, if :func:`stream_weights` made it; else ``None``."""
    return vars(tensor).get(PLACE)


def is_streamed(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a fake :func:`stream_weights` made, its data still in the checkpoint."""
    return place_of(tensor) is not None


def materialize(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s data: read from the checkpoint and cast when :func:`stream_weights` made it, else itself."""
    read = row_reader(tensor)
    return tensor if read is None else read(0, tensor.shape[0])


def row_reader(tensor: torch.Tensor) -> Callable[[int, int], torch.Tensor] | None:
    """For a weight :func:`stream_weights` made, ``rows(start, stop)``: those rows of its dim 0, read from the
    checkpoint and cast, the file opened for them alone (its pages leave the process with them); ``None`` for any
    other tensor."""
    place = place_of(tensor)
    return None if place is None else place.rows


def materialize_program(program: Any) -> int:
    """Read every weight :func:`stream_weights` left in ``program``'s state dict and constants (one the scheme did
    not store: a Linear's weight a composite reads as its operand); how many.  A data-less tensor that is no
    streamed weight (one computed from a streamed weight before the export, which would lower as zeros) is refused,
    naming it."""
    count = 0
    for table in (program.state_dict, program.constants):
        for name, tensor in list(table.items()):
            if isinstance(tensor, torch.Tensor) and _compat.is_fake_tensor(tensor) and not is_streamed(tensor):
                raise RuntimeError(
                    f"{name} {list(tensor.shape)} has no data: it was computed from a weight read from the checkpoint "
                    "only when it is compressed (checkpoints/lazy.py); export this model with --verify, which loads "
                    "its weights whole"
                )
            if isinstance(tensor, torch.Tensor) and is_streamed(tensor):
                data = materialize(tensor)
                table[name] = torch.nn.Parameter(data, requires_grad=False) if isinstance(tensor, torch.nn.Parameter) else data
                count += 1
    return count
