"""Every test starts from the same random state, whatever ran before it."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)
