"""The front door: mark, export and sub-export in one call."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from coreai_partitioner import _compat
from coreai_partitioner.records.call_sites import module_path
from coreai_partitioner.records.checks import check_externalizable, is_class_forward
from coreai_partitioner.records.fake import memoize_fake_impls
from coreai_partitioner.records.programs import deep_copy
from coreai_partitioner.records.specs import default_specs
from coreai_partitioner.records.subexport import SharedExports, subexport_and_restore

logger = logging.getLogger(__name__)

Target = type | _compat.ExternalizeSpec


class ExternalizedModules(list):
    """The records of one :func:`externalize_modules` call, one per call site.

    A list of coreai-torch ``_ExternalizedExportedProgram``; pass it to
    ``CoreAIPartitioner(externalized_modules=...)``.  The records are
    build-time state: they name custom ops registered in this process only.
    """

    #: How many ``torch.export`` runs the records took (identical call sites share one).
    sub_exports: int = 0

    def module_paths(self) -> list[str]:
        """The submodule path of every call site, in preparation order."""
        return [module_path(record) for record in self]

    def __copy__(self) -> ExternalizedModules:
        copied = ExternalizedModules(self)
        copied.sub_exports = self.sub_exports
        return copied

    def __deepcopy__(self, memo: dict) -> ExternalizedModules:
        # Each record's program is copied with its weights; the custom ops it
        # names stay this process's, so the copy lowers here like the original.
        copied = ExternalizedModules()
        for record in self:
            new = copy.copy(record)
            new.exported_program = deep_copy(record.exported_program, memo)
            copied.append(new)
        copied.sub_exports = self.sub_exports
        return copied

    def __reduce__(self) -> tuple:
        # Sub-exported programs do not survive pickling, and their custom ops exist
        # only in this process: what travels is enough for a clear error.
        return (PickledRecords, (tuple(self.module_paths()), os.getpid()))


class PickledRecords:
    """What unpickling :class:`ExternalizedModules` gives: a note, not records."""

    def __init__(self, module_paths: tuple[str, ...], pid: int) -> None:
        self.module_paths = module_paths
        self.pid = pid


def externalize_modules(
    model: torch.nn.Module,
    targets: Sequence[Target],
    *,
    export_fn: Callable[[torch.nn.Module], ExportedProgram],
    reuse_exports: bool = True,
) -> tuple[ExportedProgram, ExternalizedModules]:
    """Export ``model`` with the submodules matching ``targets`` kept as composite ops.

    Patches every matching submodule's ``forward`` into a
    ``coreai_torch_ext::<op>`` custom op, exports the model with ``export_fn``
    (which should also run ``run_decompositions(coreai_torch.get_decomp_table())``),
    then exports each call site's submodule on its own.  The model is left
    unpatched whatever happens, also when ``export_fn`` raises.

    Call sites that would export to the same graph (same class, attributes,
    input shapes and dtypes; see :mod:`coreai_partitioner.records.subexport`) are
    exported once and bound to each instance's own weights;
    ``reuse_exports=False`` exports every call site on its own.

    Returns the whole-model program, in which each call site is one opaque
    node, and one record per call site.  The caller may transform the program
    (quantize, rename nodes) before lowering it with
    ``CoreAIPartitioner(externalized_modules=records)``.
    """
    specs = [t if isinstance(t, _compat.ExternalizeSpec) else _compat.ExternalizeSpec(t) for t in targets]
    matches = _matches(model, specs)
    for path, module in matches:
        check_externalizable(path, module)
    _warn_on_unmatched(model, specs, matches)
    own_forwards = {id(m) for m in model.modules() if "forward" in vars(m)}
    try:
        return _externalize(model, specs, export_fn, reuse_exports)
    finally:
        _drop_restored_forwards(model, own_forwards)


def _externalize(
    model: torch.nn.Module,
    specs: list[_compat.ExternalizeSpec],
    export_fn: Callable[[torch.nn.Module], ExportedProgram],
    reuse_exports: bool,
) -> tuple[ExportedProgram, ExternalizedModules]:
    with warnings.catch_warnings():
        # Replaced by _warn_on_unmatched, which knows default_specs() is a superset.
        warnings.filterwarnings("ignore", message="externalize_modules: the following target")
        _compat.patch_model_for_externalization(model, specs)
    try:
        memoize_fake_impls(_compat.find_marked_submodules(model), _compat.EXTERNALIZE_NAMESPACE)
        exported_program = export_fn(model)
    except BaseException:
        _compat.restore_externalized(_compat.find_marked_submodules(model))
        raise
    # coreai-torch reads example sizes with int(SymInt), which would specialize the
    # caller's dynamic dims for good; suppressing guards keeps them dynamic.
    shape_env = _shape_env(exported_program)
    with shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext():
        # Restores every patched forward in its own ``finally``.  The composites' ops were registered above, and the
        # sub-exports register none: torch's list of the ops it can keep is made once for all of them; nor do they
        # change the whole-model graph: its call sites are found in one walk.
        exports = SharedExports(reuse=reuse_exports)
        with _compat.composite_ops_listed_once(), _compat.call_sites_found_in_one_walk(exported_program):
            records = ExternalizedModules(subexport_and_restore(model, exported_program, exports))
    records.sub_exports = exports.runs
    logger.info(
        "externalized %d call site(s) with %d sub-export(s): %s",
        len(records),
        exports.runs,
        ", ".join(records.module_paths()),
    )
    return exported_program, records


def _drop_restored_forwards(model: torch.nn.Module, own_forwards: set[int]) -> None:
    """Remove the instance ``forward`` coreai-torch's restore leaves behind.

    It restores by assigning the bound class method to the instance, which
    still shadows the class; a module that had no ``forward`` of its own gets
    none back.
    """
    for module in model.modules():
        forward = vars(module).get("forward")
        if id(module) not in own_forwards and forward is not None and is_class_forward(module, forward):
            del module.forward


def _shape_env(exported_program: ExportedProgram) -> Any:
    for node in exported_program.graph.nodes:
        fake_mode = getattr(node.meta.get("val"), "fake_mode", None)
        if fake_mode is not None and fake_mode.shape_env is not None:
            return fake_mode.shape_env
    return None


def _matches(model: torch.nn.Module, specs: list[_compat.ExternalizeSpec]) -> list[tuple[str, torch.nn.Module]]:
    """The submodules coreai-torch will patch: every non-root module matching a spec."""
    return [
        (path, module)
        for path, module in model.named_modules()
        if path and any(isinstance(module, spec.target_class) for spec in specs)
    ]


def _warn_on_unmatched(
    model: torch.nn.Module,
    specs: list[_compat.ExternalizeSpec],
    matches: list[tuple[str, torch.nn.Module]],
) -> None:
    """Warn when a spec of the caller's own matches nothing; log when nothing matches at all.

    A default composite spec that matches nothing stays silent: ``default_specs()``
    is a superset by design, and a model without composites (a plain CNN) is
    exported whole and lowered op by op, a normal use of a partitioner.
    """
    matched = {
        next(i for i, spec in enumerate(specs) if isinstance(module, spec.target_class))
        for _, module in matches
    }
    if specs and not matched:
        logger.info(
            "externalize_modules: no submodule of %s is one of the %d composite target(s); "
            "it is exported whole and lowered op by op",
            type(model).__name__,
            len(specs),
        )
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
            "stale class reference (print(model) shows the classes the model uses).",
            UserWarning,
            stacklevel=3,
        )


def check_records(records: Sequence[Any] | None) -> tuple[Any, ...]:
    """``records`` as a tuple, after checking they can be lowered in this process."""
    if records is None:
        return ()
    if isinstance(records, PickledRecords):
        raise RuntimeError(
            f"these records ({', '.join(records.module_paths) or 'none'}) were pickled in "
            f"process {records.pid}. Records are build-time state: they hold the "
            "sub-exported programs and name custom ops that torch.library registered in "
            "that process only. Call externalize_modules in the process that lowers the "
            "model, and pass its records directly."
        )
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
