"""A test layer's missing dependency: a skip on a developer's machine, a failure under CI."""

from __future__ import annotations

import pytest
from requires import require


def test_a_missing_dependency_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"no_such_module_for_the_test.*pip install -e '\.\[hf\]'"):
        require("no_such_module_for_the_test", "hf")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set, so a missing dependency fails rather than skips"):
        require("no_such_module_for_the_test", "hf")
    assert require("torch", "test").__name__ == "torch"  # installed: the module itself
