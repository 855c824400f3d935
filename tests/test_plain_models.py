"""A model without composites (a plain CNN) lowers quietly, op by op, and its ``.pte`` runs in ExecuTorch's runtime.

Lowering such a model is a normal use of an ExecuTorch partitioner: ``lower``
says nothing alarming (a ``logging`` info line), and warns only where the
caller named a class to externalize that the model does not contain.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from helpers import run_pte

from coreai_partitioner import ExternalizeSpec, lower

pytestmark = pytest.mark.slow


class PlainCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.body = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.body(torch.relu(self.stem(x))))
        return self.head(x.mean((2, 3)))


class Absent(torch.nn.Module):
    """A class the CNN does not contain."""


def plain_cnn() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return PlainCNN().eval(), (torch.randn(1, 3, 16, 16),)


def test_lowering_a_model_without_composites_warns_nothing_and_logs_that_it_is_lowered_op_by_op(caplog):
    model, sample = plain_cnn()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, "coreai_partitioner"):
        warnings.simplefilter("always")
        lower(model, sample)
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert not said, said
    assert "no submodule of PlainCNN is one of the" in caplog.text and "lowered op by op" in caplog.text


def test_specs_naming_a_class_the_model_does_not_contain_warn_naming_it():
    model, sample = plain_cnn()
    with pytest.warns(UserWarning, match="target.*Absent match no submodule of PlainCNN"):
        lower(model, sample, specs=[ExternalizeSpec(Absent)])


def test_a_plain_cnns_pte_runs_in_executorchs_runtime_and_gives_eagers_outputs():

    from coreai_partitioner.verify.describe import outside_delegates

    model, sample = plain_cnn()
    edge = lower(model, sample)
    assert not outside_delegates(edge)["forward"], "nodes left outside the Core AI delegate"
    program = edge.to_executorch()
    assert len(program.executorch_program.execution_plan[0].delegates) == 1
    actual = run_pte(program.buffer, sample)[0]
    with torch.no_grad():
        torch.testing.assert_close(actual, model(*sample), rtol=1e-4, atol=1e-5)
