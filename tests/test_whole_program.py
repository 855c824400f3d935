"""lower_whole_programs: ExecuTorch's lowering steps in another order, the same program in ExecuTorch's runtime."""

from __future__ import annotations

import operator

import pytest
import torch
from executorch.exir.delegate import executorch_call_delegate
from executorch.exir.dialects.edge._ops import EdgeOpOverload

from coreai_partitioner import CoreAIPartitioner, verify
from coreai_partitioner.lowering.whole_program import lower_whole_programs

from helpers import assert_close, seeded


class Scores(torch.nn.Module):
    """int64 tokens in (a cast outside the delegate); with ``argmax``, an int64 op outside it too."""

    def __init__(self, argmax: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.proj = torch.nn.Linear(8, 8)
        self.argmax = argmax

    def forward(self, tokens):
        scores = self.proj(self.embed(tokens))
        return (scores, scores.argmax(-1)) if self.argmax else (scores,)


def _outside(edge) -> list:
    graph = edge.exported_program().graph
    skip = (executorch_call_delegate, operator.getitem)
    return [n.target for n in graph.nodes if n.op == "call_function" and n.target not in skip]


@pytest.mark.slow
@pytest.mark.parametrize("argmax", [False, True], ids=["casts-outside", "argmax-outside"])
def test_whole_program_lowering_runs_in_executorch_as_eager(argmax):
    model = seeded(Scores(argmax)).eval()
    tokens = torch.randint(0, 16, (1, 5))
    dim = torch.export.Dim("T", min=1, max=8)
    program = torch.export.export(model, (tokens,), dynamic_shapes=({1: dim},))

    edge = lower_whole_programs({"forward": (program, CoreAIPartitioner())})

    outside = _outside(edge)
    assert outside and all(isinstance(target, EdgeOpOverload) for target in outside), outside
    assert any("argmax" in str(target) for target in outside) == argmax
    pte = edge.to_executorch().buffer
    for length in (5, 1, 8):
        tokens = torch.randint(0, 16, (1, length))
        expected = model(tokens)
        actual = verify.run(pte, tokens)
        assert len(actual) == len(expected)
        assert_close(actual[0].numpy(), expected[0])
        if argmax:
            assert torch.equal(actual[1], expected[1])


class _Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(64, 64, 7, padding=3)

    def forward(self, x):
        return torch.nn.functional.leaky_relu(self.conv(x)).reshape(1, 64, -1)


@pytest.mark.slow
def test_a_bounded_length_through_a_convolution_keeps_its_bound_in_the_written_program():
    """ExecuTorch's spec propagation runs the delegate on fake tensors with their example's sizes, and a convolution's
    oneDNN backend choice there narrowed a length bounded at 512 to 320: memory planned for 320, and a longer input
    refused by the runtime.  Every task's tail writes the program with the bound it was exported with."""
    from coreai_partitioner.lowering.methods import lower_method_modules

    model = seeded(_Conv()).eval()
    length = torch.export.Dim("L", min=1, max=512)
    edge = lower_method_modules(
        {"forward": model}, {"forward": (torch.zeros(1, 64, 4),)}, device=False, constant_methods={},
        dynamic_shapes={"forward": ({2: length},)},
    )
    program = edge.to_executorch()
    planned = [n for n in program.exported_program("forward").graph.nodes if n.op == "placeholder"][-1].meta["spec"]
    assert list(planned.shape) == [1, 64, 512]
    x = torch.randn(1, 64, 512)
    assert_close(verify.run(program.buffer, x)[0].numpy(), model(x))


@pytest.mark.slow
def test_save_pte_of_lower_keeps_a_bounded_length_through_a_convolution(tmp_path):
    from coreai_partitioner import lower, save_pte

    model = seeded(_Conv()).eval()
    path = save_pte(lower(model, (torch.zeros(1, 64, 4),), dynamic_shapes=({2: torch.export.Dim("L", min=1, max=512)},)), tmp_path / "m.pte")
    x = torch.randn(1, 64, 512)
    assert_close(verify.run(path, x)[0].numpy(), model(x))
