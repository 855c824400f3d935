"""Bind user inputs of a lowered program to constants: one lowering, many programs over its delegates.

:func:`bind_inputs` turns some user inputs of a method of a lowered
``EdgeProgramManager`` into constant tensors (lifted constants, kept in the
``.pte`` by :func:`~coreai_partitioner.lowering.external_data.executorch_config`'s
``kept``), in a copy of the graph that shares every node's target, the
delegates included: the Core AI asset is converted once and each bound
program calls it.  A bound input may have a shape of its own within its
symbolic range; the delegate passes each input with the shape it has.
Pure over the program: the graph it is given is not changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

from coreai_partitioner import _compat


def bind_inputs(edge: Any, method: str, tensors: Mapping[str, torch.Tensor], *, prefix: str = "") -> Any:
    """``edge`` (a lowered ``EdgeProgramManager``) with ``method``'s user inputs named in ``tensors`` bound to them.

    Each bound input becomes the constant ``<prefix><input name>``; its placeholder keeps its name (what
    :func:`~coreai_partitioner.lowering.external_data.constants_to`'s ``kept`` names).
    Every other method is shared as it is.  Returns a manager of the same
    class, whose ``to_executorch()`` defaults to the same config.
    """
    program = edge.exported_program(method)
    unknown = set(tensors) - set(program.graph_signature.user_inputs)
    if unknown:
        raise KeyError(f"{method} has no user input {sorted(unknown)[0]!r}; its inputs: {program.graph_signature.user_inputs}")
    bound = _bound_program(program, tensors, prefix)
    programs = {name: (bound if name == method else edge.exported_program(name)) for name in edge.methods}
    return _compat.edge_manager_like(edge, programs)


def _bound_program(program: ExportedProgram, tensors: Mapping[str, torch.Tensor], prefix: str) -> ExportedProgram:
    graph = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    output = graph.graph_copy(program.graph, copies)
    graph.output(output)
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    first_user = next(node for node in placeholders if node.name in set(program.graph_signature.user_inputs))
    fake = _compat.fake_tensor_mode_of(program)
    constants = dict(program.constants)
    specs = []
    for spec, node in zip(program.graph_signature.input_specs, placeholders):
        if spec.kind == InputKind.USER_INPUT and node.name in tensors:
            target = prefix + node.name
            tensor = tensors[node.name]
            _check_shape(node, tensor, program.range_constraints)
            constants[target] = tensor
            node.meta = {**node.meta, "val": fake.from_tensor(tensor, static_shapes=True)}
            first_user.prepend(node)  # lifted constants come before the user inputs, as torch.export orders them
            specs.append(InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(node.name), target))
        else:
            specs.append(spec)
    order = {node.name: index for index, node in enumerate(n for n in graph.nodes if n.op == "placeholder")}
    specs.sort(key=lambda spec: order[spec.arg.name])
    module = torch.fx.GraphModule(program.graph_module, graph)
    signature = _compat.graph_signature_with_inputs(program.graph_signature, specs)
    return _compat.exported_program_like(program, module, signature, constants)


def _check_shape(node: torch.fx.Node, tensor: torch.Tensor, ranges: Mapping[Any, Any]) -> None:
    """Raise unless ``tensor`` fits the shape and dtype ``node`` was exported with (a symbol within its range)."""
    val = node.meta.get("val")
    if val is None:
        return
    fits = tensor.dtype == val.dtype and tensor.dim() == val.dim() and all(
        size == expected if isinstance(expected, int) else _within(size, expected, ranges)
        for size, expected in zip(tensor.shape, val.shape)
    )
    if not fits:
        raise ValueError(
            f"input {node.name} was lowered as {val.dtype} {tuple(val.shape)}; {tensor.dtype} {tuple(tensor.shape)} "
            "does not fit it"
        )


def _within(size: int, symbolic: Any, ranges: Mapping[Any, Any]) -> bool:
    """Whether ``size`` is in the range the program declares for ``symbolic`` (its range constraint)."""
    bounds = ranges.get(_compat.sym_expr(symbolic))
    if bounds is None:
        return False
    # torch keeps a dimension exported with min=1 at 2 and up in its ranges (0/1 specialization); the lowered
    # program takes 1 all the same.
    return 1 <= size and bool(size <= bounds.upper)
