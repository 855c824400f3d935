"""The front door: mark, export and sub-export in one call."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from . import _compat
from .call_sites import module_path
from .specs import default_specs

logger = logging.getLogger(__name__)

Target = type | _compat.ExternalizeSpec


class ExternalizedModules(list):
    """The records of one :func:`externalize_modules` call, one per call site.

    A list of coreai-torch ``_ExternalizedExportedProgram``; pass it to
    ``CoreAIPartitioner(externalized_modules=...)``.  The records are
    build-time state: they name custom ops registered in this process only.
    """

    def module_paths(self) -> list[str]:
        """The submodule path of every call site, in preparation order."""
        return [module_path(record) for record in self]


def externalize_modules(
    model: torch.nn.Module,
    targets: Sequence[Target],
    *,
    export_fn: Callable[[torch.nn.Module], ExportedProgram],
) -> tuple[ExportedProgram, ExternalizedModules]:
    """Export ``model`` with the submodules matching ``targets`` kept as composite ops.

    Patches every matching submodule's ``forward`` into a
    ``coreai_torch_ext::<op>`` custom op, exports the model with ``export_fn``
    (which should also run ``run_decompositions(coreai_torch.get_decomp_table())``),
    then exports each call site's submodule on its own.  The model is left
    unpatched whatever happens, also when ``export_fn`` raises.

    Returns the whole-model program, in which each call site is one opaque
    node, and one record per call site.  The caller may transform the program
    (quantize, rename nodes) before lowering it with
    ``CoreAIPartitioner(externalized_modules=records)``.
    """
    specs = [t if isinstance(t, _compat.ExternalizeSpec) else _compat.ExternalizeSpec(t) for t in targets]
    _warn_on_unmatched(model, specs)
    with warnings.catch_warnings():
        # Replaced by _warn_on_unmatched, which knows default_specs() is a superset.
        warnings.filterwarnings("ignore", message="externalize_modules: the following target")
        _compat.patch_model_for_externalization(model, specs)
    try:
        exported_program = export_fn(model)
    except BaseException:
        _compat.restore_externalized(_compat.find_marked_submodules(model))
        raise
    # Restores every patched forward in its own ``finally``.
    records = ExternalizedModules(_compat.subexport_and_restore(model, exported_program))
    logger.info(
        "externalized %d call site(s): %s", len(records), ", ".join(records.module_paths())
    )
    return exported_program, records


def _warn_on_unmatched(model: torch.nn.Module, specs: list[_compat.ExternalizeSpec]) -> None:
    """Warn when nothing matches, or when a spec of the caller's own matches nothing.

    A default composite spec that matches nothing stays silent: ``default_specs()``
    is a superset by design.
    """
    matched: set[int] = set()
    for name, module in model.named_modules():
        index = next((i for i, s in enumerate(specs) if name and isinstance(module, s.target_class)), None)
        if index is not None:
            matched.add(index)
    if specs and not matched:
        warnings.warn(
            f"externalize_modules: none of the {len(specs)} target(s) "
            f"({', '.join(s.target_class.__name__ for s in specs)}) matches a submodule of "
            f"{type(model).__name__}, so nothing is externalized. Check the classes the "
            "model really uses (print(model)), or swap its modules for "
            "coreai_torch.composite_ops equivalents.",
            UserWarning,
            stacklevel=3,
        )
        return
    defaults = {spec.target_class for spec in default_specs()}
    unmatched = [
        s.target_class.__name__
        for i, s in enumerate(specs)
        if i not in matched and s.target_class not in defaults
    ]
    if unmatched:
        warnings.warn(
            f"externalize_modules: target(s) {', '.join(unmatched)} match no submodule of "
            f"{type(model).__name__}; they are not externalized. Check for a typo or a "
            "stale class reference.",
            UserWarning,
            stacklevel=3,
        )


def check_records(records: Sequence[Any] | None) -> tuple[Any, ...]:
    """``records`` as a tuple, after checking they can be lowered in this process."""
    if records is None:
        return ()
    if isinstance(records, (_compat.ExternalizedProgram, ExportedProgram)) or not isinstance(
        records, Sequence
    ):
        raise TypeError(
            "externalized_modules takes the list of records externalize_modules "
            f"returned, not a {type(records).__name__}"
        )
    namespace = getattr(torch.ops, _compat.EXTERNALIZE_NAMESPACE)
    for record in records:
        if not hasattr(namespace, record.op_name):
            raise RuntimeError(
                f"the record of externalized submodule '{module_path(record)}' names op "
                f"{_compat.EXTERNALIZE_NAMESPACE}::{record.op_name}, which is not registered "
                "in this process. Records are build-time state: torch.library registers "
                "the op only in the process that ran externalize_modules. Call "
                "externalize_modules in the process that lowers the model."
            )
    return tuple(records)
