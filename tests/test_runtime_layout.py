"""The runtime's Python and C++ halves live in one folder."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

RUNTIME = "coreai_partitioner.backends.apple_coreai.runtime"


@pytest.mark.parametrize("old", ["host_runtime", "runtime", "pte", "assets"])
def test_the_runtime_modules_old_paths_are_gone(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"coreai_partitioner.{old}")
    assert not hasattr(importlib.import_module("coreai_partitioner"), old)


def test_the_host_backends_cpp_sources_sit_beside_its_python_half():
    from coreai_partitioner.backends.apple_coreai.runtime import host

    folder = Path(host.__file__).parent
    assert {"CoreAIHostBackend.cpp", "Manifest.h", "coreai_host_abi.h"} <= {p.name for p in folder.iterdir()}
