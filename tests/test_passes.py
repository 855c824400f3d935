"""Graph passes over exported programs: what they rewrite, and that the rewritten graph computes the same."""

from __future__ import annotations

import pytest
import torch
from coreai_torch import get_decomp_table
from coreai_torch.composite_ops import SDPA

from coreai_partitioner.backends.apple_coreai.passes import expand_repeated_heads

INDEX_SELECT = torch.ops.aten.index_select.default
ARANGE = torch.ops.aten.arange.start_step


def exported(module: torch.nn.Module, *sample: torch.Tensor, dynamic_shapes=None) -> torch.export.ExportedProgram:
    return torch.export.export(module, sample, dynamic_shapes=dynamic_shapes).run_decompositions(get_decomp_table())


def targets(program: torch.export.ExportedProgram) -> list:
    return [node.target for node in program.graph.nodes if node.op == "call_function"]


def gqa_inputs(kv_heads: int = 2) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    return (
        torch.randn(1, 8, 5, 16, generator=generator),
        torch.randn(1, kv_heads, 12, 16, generator=generator),
        torch.randn(1, kv_heads, 12, 16, generator=generator),
    )


def test_gqa_head_repeat_in_coreai_torchs_sdpa_becomes_an_expand_and_computes_the_same():
    inputs = gqa_inputs()
    program = exported(SDPA(is_causal=True), *inputs)
    assert targets(program).count(INDEX_SELECT) == 2  # K and V, by arange(2).repeat_interleave(4)
    aranges = targets(program).count(ARANGE)
    expected = program.module()(*inputs)

    assert expand_repeated_heads(program.graph_module) == 2
    assert INDEX_SELECT not in targets(program)
    assert targets(program).count(ARANGE) == aranges - 2  # each index's chain goes with it
    torch.testing.assert_close(program.module()(*inputs), expected, rtol=0, atol=0)


class Gather(torch.nn.Module):
    def __init__(self, index: list[int]) -> None:
        super().__init__()
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 1, torch.tensor(self.index)) * 2


@pytest.mark.parametrize("index", [[1, 0], [0, 1, 0, 1], [0, 0, 1]])
def test_an_index_that_is_not_a_repeat_of_every_row_stays_an_index_select(index):
    x = torch.randn(1, 2, 3)
    program = exported(Gather(index), x)
    assert expand_repeated_heads(program.graph_module) == 0
    torch.testing.assert_close(program.module()(x), Gather(index)(x))


def test_a_symbolic_dim_keeps_the_index_select_which_coreai_builds_at_run_time():
    inputs = gqa_inputs()
    length = torch.export.Dim("S", min=2, max=64)
    program = exported(SDPA(), *inputs, dynamic_shapes=(None, {2: length}, {2: length}))
    assert expand_repeated_heads(program.graph_module) == 0
    assert targets(program).count(INDEX_SELECT) == 2



class _BatchOneTable(torch.nn.Module):
    """A ``[B, M, K]`` tensor times a ``[1, K, N]`` table, as VITS's relative-position attention multiplies."""

    def __init__(self) -> None:
        super().__init__()
        # a buffer, or VITS's padded parameter: a table that requires grad makes matmul squeeze it to an mm itself
        self.register_buffer("table", torch.randn(1, 13, 8, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        return torch.matmul(x, self.table.transpose(-2, -1))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "symbolic rows"])
def test_a_bmm_over_a_batch_one_table_becomes_one_mm_and_computes_the_same(dynamic):
    from coreai_partitioner.lowering.passes import BatchOneBmmAsMm

    model = _BatchOneTable()
    shapes = ({1: torch.export.Dim("m", min=2, max=16)},) if dynamic else None
    program = exported(model, torch.randn(2, 7, 8), dynamic_shapes=shapes)
    assert torch.ops.aten.bmm.default in targets(program)

    assert BatchOneBmmAsMm()(program.graph_module).modified
    assert torch.ops.aten.bmm.default not in targets(program) and torch.ops.aten.mm.default in targets(program)
    x = torch.randn(2, 5 if dynamic else 7, 8)
    torch.testing.assert_close(program.module()(x), model(x))


def test_a_bmm_whose_operands_both_have_a_batch_keeps_it():
    from coreai_partitioner.lowering.passes import BatchOneBmmAsMm

    program = exported(_Product(), torch.randn(2, 7, 8), torch.randn(2, 8, 3))
    assert not BatchOneBmmAsMm()(program.graph_module).modified
    assert torch.ops.aten.bmm.default in targets(program)


class _Product(torch.nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)


@pytest.mark.slow
def test_one_dimensional_interpolation_a_scalar_remainder_and_an_integer_operand_lower_whole_with_eagers_output():
    """Kokoro's vocoder's ops (partition/decompositions.py, lowering/passes.py's FloatOperands): ``F.interpolate`` on
    ``[N, C, L]`` (nearest, linear up and down), ``x % 1``, ``torch.rsqrt(torch.tensor(2))``; each killed a lowering
    or left an int64 ``index`` outside the delegate."""
    from helpers import run_edge

    from coreai_partitioner import lower
    from coreai_partitioner.verify.describe import outside_delegates

    class Vocoderish(torch.nn.Module):
        def forward(self, x):
            nearest = torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest")
            up = torch.nn.functional.interpolate(x, scale_factor=4, mode="linear")
            down = torch.nn.functional.interpolate(x, scale_factor=0.25, mode="linear")
            scaled = (x % 1) * torch.rsqrt(torch.tensor(2))
            return torch.cat([nearest.mean(-1), up.mean(-1), down.amax(-1), scaled.sum(-1)], dim=-1)

    sample = (torch.randn(1, 3, 16) * 3,)
    edge = lower(Vocoderish().eval(), sample)
    assert outside_delegates(edge) == {"forward": {}}
    torch.testing.assert_close(torch.as_tensor(run_edge(edge, sample)), Vocoderish()(*sample), rtol=1e-5, atol=1e-5)
