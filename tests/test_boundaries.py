"""The delegate's boundaries a model marks (``partition/boundaries.py``): pure functions over FX graphs."""

from __future__ import annotations

import torch

from coreai_partitioner.partition.boundaries import sizes_from_floats


class _TokensAsFloats(torch.nn.Module):
    """What the device form does with its tokens: cast them to fp32, then use their length."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        floats = tokens.to(torch.float32)
        return floats * torch.arange(tokens.shape[1], dtype=torch.float32)


def _exported() -> torch.export.ExportedProgram:
    sample = (torch.zeros(1, 3, dtype=torch.long),)
    dims = ({1: torch.export.Dim("T", max=8)},)
    return torch.export.export(_TokensAsFloats(), sample, dynamic_shapes=dims).run_decompositions()  # casts as _to_copy


def _size_sources(graph: torch.fx.Graph) -> list[torch.dtype]:
    return [n.args[0].meta["val"].dtype for n in graph.nodes if n.target is torch.ops.aten.sym_size.int]


def test_a_size_read_off_integer_tokens_is_read_off_their_floating_cast_after_it():
    program = _exported()
    assert _size_sources(program.graph) == [torch.int64]
    assert sizes_from_floats(program.graph) == 1
    assert _size_sources(program.graph) == [torch.float32]
    program.graph.lint()  # every size read after the cast it reads
    tokens = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(program.graph_module(tokens)[0], torch.tensor([[0.0, 6.0, 14.0, 24.0]]))


def test_a_size_without_a_floating_cast_stays_where_it_is():
    class Plain(torch.nn.Module):
        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return torch.arange(tokens.shape[1]) + tokens

    sample = (torch.zeros(1, 3, dtype=torch.long),)
    program = torch.export.export(Plain(), sample, dynamic_shapes=({1: torch.export.Dim("T", max=8)},))
    assert sizes_from_floats(program.graph) == 0
    assert _size_sources(program.graph) == [torch.int64]
