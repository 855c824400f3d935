"""coreai-partitioner: Core AI composite ops through ExecuTorch's ``to_edge_transform_and_lower``.

The path of a record, from the model to the converter:

1. **Externalize** (:func:`externalize_modules`).  coreai-torch patches every
   submodule matching a spec (:func:`default_specs`, :func:`spec_for`, or your
   own ``ExternalizeSpec``) into a ``coreai_torch_ext::<op>`` custom op, the
   caller's ``export_fn`` exports the model, and each call site's submodule is
   exported on its own.  One *record* per call site comes back; its
   ``source_nodes`` name the call site's FX node *at that moment*.  The model
   is unpatched again.

2. **Transform** (the caller).  Quantization, renaming passes, and then
   ExecuTorch's ``to_edge`` rebuild the graph: every node is renamed
   (``n0_norm_ab12`` becomes ``coreai_torch_ext_n0_norm_ab12_default``) and
   custom node metadata is dropped.  The op *target* survives.

3. **Partition** (:class:`CoreAIPartitioner`).  Every record is re-resolved by
   op target against the edge program and the records' own sub-exports
   (:mod:`coreai_partitioner.call_sites`, a pure function over FX graphs).
   Call sites with a record are claimed alongside the ops upstream's
   partitioner claims, and stamped with a key into this process's table of
   build-time records (:mod:`coreai_partitioner.build_records`); nothing about
   the records enters a compile spec or the ``.pte``.

4. **Convert** (``CoreAICompositeBackend.preprocess``, in ``backends/``).  Each
   delegate takes exactly the records whose call sites lie in its graph (and
   their nested records), re-resolves them against the very graph handed to
   ``TorchConverter.add_exported_program(..., _externalized_exported_programs=...)``,
   converts, checks the delegate boundary, and ships the asset the way
   upstream's backend does.

5. **Verify** (:mod:`coreai_partitioner.verify`, :mod:`coreai_partitioner.testing`,
   ``python -m coreai_partitioner``).  The shipped assets run on the Core AI
   runtime (Linux CPU included) and are compared with eager PyTorch.
"""

from . import _compat, verify
from ._compat import ExternalizeSpec, do_not_delegate, get_default_compile_config, get_default_passes
from .externalize import ExternalizedModules, externalize_modules
from .host_runtime import load_runtime_backend
from .partitioner import CoreAIPartitioner
from .specs import default_specs, spec_for

__all__ = [
    "CoreAIPartitioner",
    "verify",
    "ExternalizeSpec",
    "ExternalizedModules",
    "default_specs",
    "do_not_delegate",
    "externalize_modules",
    "get_default_compile_config",
    "get_default_passes",
    "load_runtime_backend",
    "spec_for",
]

del _compat


def __getattr__(name: str):
    # coreai_partitioner.hf needs transformers (the hf extra); import it on first use.
    if name == "hf":
        import importlib

        return importlib.import_module(".hf", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
