"""What makes a submodule externalizable, checked before anything is patched.

Each check raises with the submodule's path, its class and the way out, instead
of the error torch.library or torch.export would give halfway through.
"""

from __future__ import annotations

import inspect
import keyword
import types
import typing

import torch

from coreai_partitioner import _compat
from coreai_partitioner._compat import EXTERNALIZE_NAMESPACE

_TENSOR_NAMES = {"Tensor", "torch.Tensor"}


def _is_tensor(annotation: typing.Any) -> bool:
    """``Tensor`` or an optional ``Tensor``, written as a type or as a string."""
    if isinstance(annotation, str):
        text = annotation.replace(" ", "")
        for wrapper in ("Optional[", "typing.Optional["):
            if text.startswith(wrapper) and text.endswith("]"):
                text = text[len(wrapper) : -1]
        parts = set(text.split("|")) - {"None"}
        return len(parts) == 1 and parts <= _TENSOR_NAMES
    if annotation is torch.Tensor:
        return True
    args = set(typing.get_args(annotation)) - {type(None)}
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and args == {torch.Tensor}


def _annotations(cls: type) -> tuple[list[inspect.Parameter], typing.Any]:
    forward = cls.forward
    signature = inspect.signature(forward)
    try:
        hints = typing.get_type_hints(forward)
    except Exception:  # noqa: BLE001 - unresolvable string annotations: use them as written
        hints = {}
    parameters = [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in list(signature.parameters.values())[1:]
    ]
    return parameters, hints.get("return", signature.return_annotation)


def is_class_forward(module: torch.nn.Module, forward: typing.Any) -> bool:
    """No instance ``forward``, or the class's own bound to it (how coreai-torch restores)."""
    return forward is None or (
        getattr(forward, "__self__", None) is module
        and getattr(forward, "__func__", None) is type(module).forward
    )


def check_externalizable(path: str, module: torch.nn.Module) -> None:
    """Raise ``TypeError`` naming ``path``, its class and the fix if ``module`` cannot be externalized."""
    cls = type(module)
    where = f"submodule '{path}' ({cls.__name__})"
    op_name = path.replace(".", "_")
    if not op_name.isidentifier() or keyword.iskeyword(op_name):
        raise TypeError(
            f"{where} cannot be externalized: coreai-torch names its op "
            f"{EXTERNALIZE_NAMESPACE}::{op_name}_<suffix> after the module path, and "
            f"'{op_name}' is not an identifier. Hold the module under a named attribute "
            "(for example self.block = ... instead of a bare nn.Sequential at the root)."
        )
    if not is_class_forward(module, vars(module).get("forward")):
        raise TypeError(
            f"{where} cannot be externalized: it has its own instance-level forward, which "
            "the composite op would not capture. Subclass the module and override forward instead."
        )
    if _compat.has_forward_hooks(module):
        raise TypeError(
            f"{where} cannot be externalized: it has forward hooks, which would run both "
            "inside the composite graph and around it. Remove the hooks before externalizing "
            "(module.remove_hooks or handle.remove()), or leave the class out of the specs."
        )
    parameters, returns = _annotations(cls)
    missing = [p.name for p in parameters if p.annotation is inspect.Parameter.empty]
    if missing or returns is inspect.Signature.empty:
        what = ", ".join(missing) if missing else "its return value"
        raise TypeError(
            f"{where} cannot be externalized: {cls.__name__}.forward has no type annotation "
            f"for {what}, and torch.library builds the composite op's schema from them. "
            f"Either annotate {cls.__name__}.forward (torch.Tensor, torch.Tensor | None, and a "
            "torch.Tensor or tuple of them as the return), or swap the module for its "
            "coreai_torch.composite_ops equivalent (for an RMSNorm: "
            "coreai_torch.composite_ops.RMSNorm with the same weight and eps)."
        )
    for parameter in parameters:
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(
                f"{where} cannot be externalized: {cls.__name__}.forward takes "
                f"{'*' if parameter.kind is inspect.Parameter.VAR_POSITIONAL else '**'}{parameter.name}; "
                "a composite op needs a fixed list of tensor arguments."
            )
        if not _is_tensor(parameter.annotation):
            raise TypeError(
                f"{where} cannot be externalized: {cls.__name__}.forward takes the non-tensor "
                f"argument '{parameter.name}' ({_spelled(parameter.annotation)}). A composite's "
                "inputs must be tensors: make it an attribute set in __init__ (and list it in "
                "composite_attrs), or pass it as a tensor."
            )


def _spelled(annotation: typing.Any) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
