"""One-call checks for CI jobs: externalize, lower, serialize, run on Core AI, compare."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from coreai_partitioner import verify
from coreai_partitioner._compat import ExternalizeSpec
from coreai_partitioner.records.externalize import externalize_modules
from coreai_partitioner.lowering.lower import export_with_composites, lower_exported, save_pte
from coreai_partitioner.records.specs import default_specs


def assert_lowers_and_matches(
    model: torch.nn.Module,
    sample: torch.Tensor | Sequence[Any],
    *,
    specs: Sequence[type | ExternalizeSpec] | None = None,
    export_fn: Callable[[torch.nn.Module], ExportedProgram] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    **partitioner_options: Any,
) -> verify.Report:
    """Lower ``model`` with its composites and check the ``.pte``'s delegates against eager.

    Externalizes ``specs`` (default: :func:`default_specs`), lowers with
    ``CoreAIPartitioner(**partitioner_options)``, serializes the ``.pte``, runs
    its Core AI delegates on the Core AI runtime (the rest of the program in
    PyTorch) and compares every output with ``model(*sample)``.  Raises
    ``AssertionError`` with the report table on a mismatch, so it works in
    pytest and unittest alike; returns the report otherwise.

    The eager reference runs after lowering, once, on ``model`` itself.
    """
    sample = tuple(sample) if isinstance(sample, (tuple, list)) else (sample,)
    if export_fn is None:
        exported = export_with_composites(model, sample, specs=specs)
    else:
        exported = externalize_modules(model, default_specs() if specs is None else specs, export_fn=export_fn)
    with contextlib.ExitStack() as stack:
        sidecar_dir = None
        if partitioner_options.get("uses_sidecar"):
            from executorch.backends.apple.coreai import coreai_sidecar_dir

            sidecar_dir = stack.enter_context(tempfile.TemporaryDirectory())
            stack.enter_context(coreai_sidecar_dir(sidecar_dir))
        with tempfile.TemporaryDirectory() as directory:
            pte = save_pte(lower_exported(exported, **partitioner_options), Path(directory) / "model.pte")
            report = verify.check(pte, model, *sample, rtol=rtol, atol=atol, sidecar_dir=sidecar_dir)
    report.raise_for_mismatch()
    return report
