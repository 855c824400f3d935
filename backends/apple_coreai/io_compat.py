"""The delegate-boundary check, aware of Core AI state.

Upstream's ``assert_io_compatible`` compares every Core AI graph argument and
result with a tensor, but coreai-torch gives a mutated buffer a
``!coreai.handle<tensor<...>>`` argument and a ``!coreai.token`` result, so a
stateful delegate always failed the check.  Here a handle stands for its
inner tensor and the k-th token result for the k-th handle's tensor; the
comparison itself is upstream's ``io_mismatches``.
"""

from __future__ import annotations

from typing import Any

from torch.export import ExportedProgram

from coreai_partitioner import _compat


def coreai_io(program: Any, entrypoint: str = "main") -> tuple[list, list]:
    """A Core AI graph's I/O as ``(element type, shape)`` pairs, state included."""
    types = _compat.coreai_types()
    HandleType, TokenType, RankedTensorType = types.HandleType, types.TokenType, types.RankedTensorType
    func_type = _compat.graph_function_type(program, entrypoint)

    def describe(t: Any) -> tuple[str, tuple | None]:
        if RankedTensorType.isinstance(t):
            t = RankedTensorType(t)
            return (str(t.element_type), tuple(t.shape))
        return (str(t), None)

    inputs, states = [], []
    for t in func_type.inputs:
        if HandleType.isinstance(t):
            states.append(describe(HandleType(t).inner_type))
            inputs.append(states[-1])
        else:
            inputs.append(describe(t))
    tokens = iter(states)
    outputs = [
        next(tokens, describe(t)) if TokenType.isinstance(t) else describe(t)
        for t in func_type.results
    ]
    return inputs, outputs


def assert_io_compatible(program: Any, edge_program: ExportedProgram, entrypoint: str = "main") -> None:
    """Raise if the Core AI boundary of ``entrypoint`` does not match what ExecuTorch feeds and reads."""
    coreai_in, coreai_out = coreai_io(program, entrypoint)
    edge_in, edge_out = _compat.edge_io(edge_program)
    errors = _compat.io_mismatches(coreai_in, edge_in, "input") + _compat.io_mismatches(
        coreai_out, edge_out, "output"
    )
    if errors:
        raise ValueError(
            "Core AI delegate boundary is incompatible with ExecuTorch:\n  " + "\n  ".join(errors)
        )


def default_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a tensor of ``shape`` in the default dim order (row-major, size-1 and size-0 dims included),
    the only layout upstream's device runtime passes to Core AI."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
