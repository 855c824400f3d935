"""The front door: mark, export and sub-export in one call."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from . import _compat
from .call_sites import module_path

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
    _compat.patch_model_for_externalization(model, list(targets))
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
