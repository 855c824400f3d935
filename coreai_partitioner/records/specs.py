"""Externalization specs for the composite ops coreai-torch ships.

A composite op class in ``coreai_torch.composite_ops`` is a *leaf* when its
instances carry a ``version`` (``RMSNormImpl``, ``RoPE``, ``SDPA``,
``GatherMM``, ``GatedDeltaUpdate``); wrappers such as ``RMSNorm`` only hold a
leaf and its weight.  A leaf's composite attributes are the public attributes
its ``__init__`` assigns, read from the installed source, so a new coreai-torch
release that adds an attribute is picked up without an edit here.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap

import torch

from coreai_partitioner import _compat
from coreai_partitioner._compat import ExternalizeSpec

# Attributes every leaf carries that are not part of the composite declaration.
_NOT_ATTRS = frozenset({"version", "training"})


def _init_assignments(cls: type) -> list[str]:
    """Names ``cls.__init__`` assigns as ``self.<name> = ...``, in source order."""
    source = textwrap.dedent(inspect.getsource(cls.__init__))
    function = ast.parse(source).body[0]
    self_name = function.args.args[0].arg
    names: list[str] = []
    for node in ast.walk(function):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == self_name
                and target.attr not in names
            ):
                names.append(target.attr)
    return names


def _leaf_spec(cls: type) -> ExternalizeSpec | None:
    assigned = _init_assignments(cls)
    if "version" not in assigned:
        return None
    attrs = [name for name in assigned if not name.startswith("_") and name not in _NOT_ATTRS]
    return ExternalizeSpec(cls, composite_op_name=_compat.composite_op_name(cls), composite_attrs=attrs)


@functools.cache
def _installed_specs() -> tuple[ExternalizeSpec, ...]:
    from coreai_torch import composite_ops

    classes = [getattr(composite_ops, name) for name in composite_ops.__all__]
    specs = [
        _leaf_spec(cls)
        for cls in classes
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module)
    ]
    return tuple(spec for spec in specs if spec is not None)


def default_specs() -> list[ExternalizeSpec]:
    """One spec per composite op leaf of the installed ``coreai_torch.composite_ops``.

    Pass them (plus your own) to :func:`coreai_partitioner.externalize_modules`.
    A spec whose class does not occur in the model is skipped silently (a
    model without composites is lowered op by op); a class of your own that
    matches nothing warns.
    """
    return [_copy(spec) for spec in _installed_specs()]


def spec_for(name: str) -> ExternalizeSpec:
    """The default spec for one composite, by composite name or class name.

    ``spec_for("rms_norm")`` and ``spec_for("RMSNormImpl")`` are the same spec.
    """
    for spec in _installed_specs():
        if name in (spec.composite_op_name, spec.target_class.__name__):
            return _copy(spec)
    known = ", ".join(
        f"{spec.composite_op_name} ({spec.target_class.__name__})" for spec in _installed_specs()
    )
    raise KeyError(f"no composite op named {name!r} in coreai_torch.composite_ops; known: {known}")


def _copy(spec: ExternalizeSpec) -> ExternalizeSpec:
    return ExternalizeSpec(
        spec.target_class,
        composite_op_name=spec.composite_op_name,
        composite_attrs=list(spec.composite_attrs or []),
    )
