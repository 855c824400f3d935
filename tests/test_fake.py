"""The memoized fake impls of externalized ops, on symbolic sizes (coreai_partitioner.records.fake)."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
    StrictMinMaxConstraint,
)
from torch.utils._sympy.value_ranges import ValueRanges

from coreai_partitioner.records.fake import memoized


class Counting:
    """A forward that counts its runs."""

    def __init__(self, forward):
        self.forward, self.runs = forward, 0

    def __call__(self, *args, **kwargs):
        self.runs += 1
        return self.forward(*args, **kwargs)


def fake_mode() -> FakeTensorMode:
    return FakeTensorMode(shape_env=ShapeEnv(), static_shapes=False)


def symbolic(mode: FakeTensorMode, shape: tuple[int, ...], dynamic: tuple[int, ...], low: int = 1, high: int = 64):
    """A fake tensor of ``shape`` whose ``dynamic`` dims are new symbols ranging over [low, high] (made outside the mode)."""
    sizes = [DimDynamic.DYNAMIC if d in dynamic else DimDynamic.STATIC for d in range(len(shape))]
    ranges = [StrictMinMaxConstraint(vr=ValueRanges(low, high), warn_only=False) if d in dynamic else None
              for d in range(len(shape))]
    context = StatelessSymbolicContext(dynamic_sizes=sizes, constraint_sizes=ranges)
    tensor = mode.from_tensor(torch.empty(shape), symbolic_context=context)
    assert all(isinstance(tensor.shape[d], torch.SymInt) for d in dynamic)
    return tensor


def test_call_sites_over_the_same_symbol_run_the_forward_once_and_get_their_own_sizes():
    forward = Counting(lambda x, w: x * w)
    fake = memoized(forward)
    mode = fake_mode()
    x = symbolic(mode, (1, 5, 8), dynamic=(1,))
    with mode:
        first = fake(x, torch.ones(8))
        second = fake(x + 1, torch.ones(8))
    assert forward.runs == 1
    assert first.shape == second.shape == x.shape and second.stride() == x.stride()


def test_a_new_shape_environment_with_the_same_structure_reuses_the_entry():
    # ExecuTorch re-traces into a fresh ShapeEnv: its T is a new symbol with the same range.
    forward = Counting(lambda x: x.sum(-1, keepdim=True))
    fake = memoized(forward)
    outputs = []
    for _ in range(2):
        mode = fake_mode()
        x = symbolic(mode, (1, 5, 8), dynamic=(1,), low=2, high=32)
        with mode:
            outputs.append((fake(x).shape, x.shape[1]))
    assert forward.runs == 1
    for shape, t in outputs:
        assert shape[1] is t or shape[1].node.expr == t.node.expr
        assert (shape[0], shape[2]) == (1, 1)


def test_a_different_range_is_a_different_signature():
    forward = Counting(lambda x: x * 2)
    fake = memoized(forward)
    for high in (32, 64):
        mode = fake_mode()
        x = symbolic(mode, (1, 5, 8), dynamic=(1,), low=2, high=high)
        with mode:
            fake(x)
    assert forward.runs == 2


def test_an_output_size_that_is_no_input_size_runs_the_forward_every_time():
    forward = Counting(lambda x: torch.cat([x, x], dim=1))  # 2*T
    fake = memoized(forward)
    mode = fake_mode()
    x = symbolic(mode, (1, 5, 8), dynamic=(1,))
    with mode:
        first, second = fake(x), fake(x)
    assert forward.runs == 2
    assert first.shape[1].node.expr == second.shape[1].node.expr == 2 * x.shape[1].node.expr


def test_a_non_contiguous_symbolic_output_runs_the_forward_every_time():
    forward = Counting(lambda x: x.transpose(1, 2))
    fake = memoized(forward)
    mode = fake_mode()
    x = symbolic(mode, (1, 5, 8), dynamic=(1,))
    with mode:
        fake(x)
        out = fake(x)
    assert forward.runs == 2
    assert out.stride() == x.transpose(1, 2).stride()


def test_concrete_inputs_keep_their_output_strides():
    forward = Counting(lambda x: x.transpose(0, 1))
    fake = memoized(forward)
    with FakeTensorMode():
        x = torch.empty(3, 4)
        first, second = fake(x), fake(x)
    assert forward.runs == 1
    assert second.shape == first.shape == (4, 3) and second.stride() == first.stride() == (1, 4)
