"""Sub-export identical call sites once.

coreai-torch runs one ``torch.export`` per call site; in an LLM most call
sites are the same module class with the same attributes and input shapes
(every layer's RMSNorm), so their sub-exports differ only in weights.  Here
the first such call site is exported and the others get a copy of its graph
bound to their own instance's parameters and buffers: each call site still has
its own program, its own ``noinline`` graph and its own weights.

Sharing is keyed on everything that can change what export traces: the class
of the module and of every submodule, every plain attribute, parameter and
buffer names/shapes/dtypes, training mode, and the call site's input shapes,
dtypes, dynamic dims and omitted optional arguments.  A module carrying
anything else (a tensor attribute, a hook, an instance-level ``forward``, an
attribute of an unknown type) is never shared.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import torch
from torch.export import ExportedProgram

from coreai_partitioner import _compat
from coreai_partitioner.records.checks import is_class_forward
from coreai_partitioner.records.programs import with_own_graph


_SIMPLE = (type(None), bool, int, float, complex, str, bytes, enum.Enum, torch.dtype, torch.device, torch.Size)


class Unalike(Exception):
    """A module's structure cannot be told from its attributes (:func:`structure_key`); the message says why."""


def _simple(value: Any) -> Any:
    if isinstance(value, _SIMPLE):
        return (type(value), value)
    if isinstance(value, (tuple, frozenset)):
        return (type(value), tuple(_simple(v) for v in value))
    raise Unalike(f"an attribute of type {type(value).__name__}")


def module_key(module: torch.nn.Module) -> tuple | None:
    """What makes two modules trace alike on the same inputs (:func:`call_site_key`'s part), or None when unsure.

    A module coreai-torch has marked counts as running its class's forward
    when the forward it saved is the class's own.
    """
    try:
        return structure_key(module)
    except Unalike:
        return None


def structure_key(module: torch.nn.Module, value_key: Callable[[Any], Any] = _simple, where: str = "the module") -> tuple:
    """The classes, plain attributes (each as ``value_key`` gives it), training mode, and parameter and buffer names,
    shapes and dtypes of ``module`` and its submodules.  Raises :class:`Unalike` for a hook or an instance
    ``forward`` (on ``where``'s submodule, the message says) and for an attribute ``value_key`` cannot key."""
    key = []
    for path, sub in module.named_modules(remove_duplicate=False):
        state = vars(sub)
        if any(state.get(hook) for hook in _compat.MODULE_HOOK_ATTRS):
            raise Unalike(f"a hook on {where}'s {path or 'module'}")
        if not is_class_forward(sub, state.get(_compat.EXTERNALIZED_FORWARD_ATTR, state.get("forward"))):
            raise Unalike(f"an instance forward on {where}'s {path or 'module'}")
        attrs = tuple(
            (name, value_key(value))
            for name, value in sorted(state.items())
            if name not in _compat.MODULE_INTERNAL_ATTRS
            and name not in _compat.MODULE_HOOK_ATTRS
            and name != "forward"
            and not name.startswith(_compat.EXTERNALIZE_ATTR_PREFIXES)
        )
        own_params, own_buffers, non_persistent = _compat.module_state(sub)
        params = tuple(
            (name, None if p is None else (tuple(p.shape), p.dtype, p.requires_grad))
            for name, p in own_params.items()
        )
        buffers = tuple(
            (name, None if b is None else (tuple(b.shape), b.dtype)) for name, b in own_buffers.items()
        )
        key.append((path, type(sub), sub.training, attrs, params, buffers, tuple(sorted(non_persistent))))
    return tuple(key)


def _dynamic_key(dynamic_shapes: tuple) -> tuple:
    """Which dims are dynamic, their ranges, and which dims share one symbol."""
    ids: dict[int, int] = {}
    key = []
    for dims in dynamic_shapes:
        if not dims:
            key.append(None)
            continue
        key.append(
            tuple(
                (axis, ids.setdefault(id(dim), len(ids)), getattr(dim, "min", None), getattr(dim, "max", None))
                for axis, dim in sorted(dims.items())
            )
        )
    return tuple(key)


def call_site_key(prep: Any) -> tuple | None:
    """What makes two call sites export to the same graph, or None when unsure."""
    node = prep.source_nodes[0]
    module = module_key(prep.module)
    if node.kwargs or module is None:
        return None
    return (
        prep.composite_op_name,
        tuple(arg is None for arg in node.args),
        tuple((tuple(t.shape), t.dtype) for t in prep.fake_inputs),
        _dynamic_key(prep.dynamic_shapes),
        module,
    )


def rebind(program: ExportedProgram, module: torch.nn.Module) -> ExportedProgram:
    """``program`` over its own graph copy and ``module``'s parameters and buffers.

    Lifted constants that the forward created are shared: they depend on the
    code alone.
    """
    tensors = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(module.named_buffers(remove_duplicate=False))
    return with_own_graph(
        program,
        state_dict={name: tensors[name] for name in program.state_dict},
        constants={name: tensors.get(name, value) for name, value in program.constants.items()},
    )


class SharedExports:
    """Exports one call site's submodule, reusing the export of an identical earlier one.

    Called by :func:`subexport_and_restore` for
    every call site, in preparation order.
    """

    def __init__(self, reuse: bool = True) -> None:
        self.reuse = reuse
        self.runs = 0
        self._exports: dict[tuple, ExportedProgram] = {}

    def __call__(self, prep: Any) -> ExportedProgram:
        key = call_site_key(prep) if self.reuse else None
        if key is not None and key in self._exports:
            program = rebind(self._exports[key], prep.module)
            prep.composite_input_names, prep.composite_output_names = _compat.derive_composite_io_names(program)
            return program
        program = _export(prep)
        self.runs += 1
        if key is not None:
            self._exports[key] = program
        return program


def _export(prep: Any) -> ExportedProgram:
    """The call site's submodule exported to core ATen IR, as coreai-torch's export and ``run_decompositions()``
    make it, in one trace instead of two (:func:`~coreai_partitioner._compat.export_decomposed`)."""
    args, kwargs, dynamic_shapes = _compat.call_site_arguments(prep)
    try:
        program = _compat.export_decomposed(prep.module, args, dynamic_shapes, _compat.core_aten_table(), kwargs)
    except Exception as error:
        raise RuntimeError(
            f"failed to export externalized submodule '{prep.module_path}' "
            f"({type(prep.module).__name__}) on its own: {error}"
        ) from error
    prep.composite_input_names, prep.composite_output_names = _compat.derive_composite_io_names(program)
    return program


def subexport_and_restore(
    model: torch.nn.Module,
    exported_program: ExportedProgram,
    export_call_site: Callable[[Any], ExportedProgram],
) -> list[Any]:
    """coreai-torch 0.4.3's ``_subexport_and_restore`` (Phases 2-3), mirrored, exporting through ``export_call_site``.

    coreai-torch exports every call site's submodule itself; here the caller
    decides (:class:`SharedExports` exports
    identical call sites once).  Returns one record per call site.  The
    model's patched forwards are restored whatever happens.
    """
    try:
        _compat.drop_missing_call_sites(model, exported_program)
        return [
            _compat.finalize_module_export(prep, export_call_site(prep))
            for prep in _compat.PreparedModules(model, exported_program)
        ]
    finally:
        _compat.restore_externalized(_compat.find_marked_submodules(model))
