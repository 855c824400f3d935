"""coreai-partitioner: Core AI composite ops through ExecuTorch's ``to_edge_transform_and_lower``.

A stage is a folder, in the order a record goes through them:

1. **Externalize** (``records/``: :func:`externalize_modules`).
   coreai-torch patches every submodule matching a spec (``records/specs.py``:
   :func:`default_specs`, :func:`spec_for`, or your own ``ExternalizeSpec``)
   into a ``coreai_torch_ext::<op>`` custom op, the caller's ``export_fn``
   exports the model, and each call site's submodule is exported on its own
   (``records/subexport.py`` exports identical call sites once).  One *record*
   per call site comes back: its op name, its sub-exported program, and the
   name its call site's FX node had *at that moment*.  The model is unpatched
   again.

2. **Transform** (the caller; ``quantize/`` for weight-only schemes).
   Quantization, renaming passes, and then ExecuTorch's ``to_edge`` rebuild
   the graph: every node is renamed (``n0_norm_ab12`` becomes
   ``coreai_torch_ext_n0_norm_ab12_default``) and custom node metadata is
   dropped.  The op *target* survives.

3. **Partition** (``partition/``: :class:`CoreAIPartitioner`).  Every call
   site of the edge program (and of the records' own sub-exports, for nested
   submodules) is paired with a record, once, by op target in graph order,
   checked against the record's sub-exported input shapes and dtypes
   (``records/call_sites.py``, pure functions over FX graphs).  Paired call
   sites are claimed alongside the ops upstream's rules claim
   (``partition/op_support.py``), and each carries its record in
   ``node.meta`` (``records/carried.py``), a reference that ExecuTorch's graph
   copies keep as it is.  Nothing about the records enters a compile spec or
   the ``.pte``.

4. **Convert** (``backends/apple_coreai/``: ``CoreAICompositeBackend.preprocess``).
   Each delegate reads the records off its own call sites, renames them after
   their submodule paths so every build names them alike, rewrites its own
   graph (``passes.py``) and hands it to coreai-torch's converter with the
   records (``convert.py``); then checks the delegate boundary, writes the
   asset the same bytes on every build (``asset.py``) and ships it with
   upstream's manifest (``manifest.py``, ``deliver.py``).  Private names of
   other packages are reached only through :mod:`._compat`.

5. **Run and verify** (``verify/``, the host runtime in
   ``backends/apple_coreai/runtime/``).  ExecuTorch's own runtime runs the
   ``.pte`` here, its Core AI delegates on coreai-core's runtime (Linux CPU
   included), and the outputs are compared with eager PyTorch, or judged by
   SNR against the fp32 model when the program computes in lower precision.

``lowering/`` does steps 1 to 4 and writes the file for the common case
(:func:`lower`, :func:`save_pte`); ``recipes/`` gives the same road as
ExecuTorch export recipes and optimum-executorch recipes; ``cli/`` is
``python -m coreai_partitioner``.

An LLM (``text_generation/``: :func:`text_generation.lower_decoder`) takes the same road with a
first step of its own: its family file (``text_decoder/families/``) re-composes the
Hugging Face model's layers from the primitives in ``blocks/`` over the
model's own weights.  Then it is exported with its composites externalized
(step 1), its weights quantized (2), and lowered with steps 2 and 3 swapped
(``lowering/whole_program.py``): its one delegate takes the whole graph, so it is
decomposed once, partitioned and converted on ATen IR, and only the casts
left around the delegate become edge dialect.  ``text_decoder/device.py`` makes the
form upstream's on-device runtime runs; ``text_generation/check.py`` judges the result
against the eager model it was lowered from.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING

# Importing the package imports nothing else: the public names below load on first use, so
# ``coreai_partitioner.console`` can quiet the dependencies before a command imports them.  A
# library user asks for the same with ``coreai_partitioner.console.quiet_dependencies()``.
_PUBLIC = {
    "CoreAIPartitioner": ".partition.partitioner",
    "ExternalizeSpec": "._compat",
    "ExternalizedModules": ".records.externalize",
    "default_specs": ".records.specs",
    "do_not_delegate": "._compat",
    "export_with_composites": ".lowering.lower",
    "externalize_modules": ".records.externalize",
    "get_default_compile_config": ".lowering.passes",
    "get_default_passes": ".lowering.passes",
    "load_runtime_backend": ".backends.apple_coreai.runtime.host",
    "lower": ".lowering.lower",
    "lower_exported": ".lowering.lower",
    "save_pte": ".lowering.lower",
    "spec_for": ".records.specs",
}

__all__ = [*_PUBLIC, "verify"]

if TYPE_CHECKING:
    from coreai_partitioner import text_generation, verify
    from coreai_partitioner._compat import ExternalizeSpec, do_not_delegate
    from coreai_partitioner.backends.apple_coreai.runtime.host import load_runtime_backend
    from coreai_partitioner.records.externalize import ExternalizedModules, externalize_modules
    from coreai_partitioner.lowering.lower import export_with_composites, lower, lower_exported, save_pte
    from coreai_partitioner.partition.partitioner import CoreAIPartitioner
    from coreai_partitioner.lowering.passes import get_default_compile_config, get_default_passes
    from coreai_partitioner.records.specs import default_specs, spec_for


def __getattr__(name: str):
    # ``text_generation`` needs transformers (the hf extra) to adapt a model; it, like every public name, loads on first use.
    if name in ("text_generation", "verify"):
        return importlib.import_module(f".{name}", __name__)
    if name == "llm":
        warnings.warn(
            "coreai_partitioner.llm is now coreai_partitioner.text_generation (the text-generation task's room); "
            "import that name instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(".text_generation", __name__)
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "text_generation"})
