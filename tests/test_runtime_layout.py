"""The runtime's Python and C++ halves live in one folder; the old module paths still import."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

RUNTIME = "coreai_partitioner.backends.apple_coreai.runtime"


@pytest.mark.parametrize(
    ("old", "new"),
    [("host_runtime", "host"), ("runtime", "loaded_asset"), ("pte", "pte"), ("assets", "asset_ir")],
)
def test_moved_runtime_modules_keep_their_old_import_paths(old, new):
    moved = importlib.import_module(f"{RUNTIME}.{new}")
    assert importlib.import_module(f"coreai_partitioner.{old}") is moved
    assert getattr(importlib.import_module("coreai_partitioner"), old) is moved


def test_the_host_backends_cpp_sources_sit_beside_its_python_half():
    from coreai_partitioner.backends.apple_coreai.runtime import host

    folder = Path(host.__file__).parent
    assert {"CoreAIHostBackend.cpp", "Manifest.h", "coreai_host_abi.h"} <= {p.name for p in folder.iterdir()}
