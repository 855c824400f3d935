"""Weight-only quantization between ``externalize_modules`` and lowering: integers or look-up tables, a weight at a time.

Where it goes in the flow::

    ep, records = externalize_modules(model, default_specs(),
                                      export_fn=lambda m: torch.export.export(m, sample, dynamic_shapes=shapes))
    ep = quantize(ep, "int4-channel", records=records, dynamic_shapes=shapes)   # decomposes it too
    quantized_eager = ep.module()                   # the reference for verify, before lowering consumes ep
    lowered = to_edge_transform_and_lower(ep, partitioner=[CoreAIPartitioner(externalized_modules=records)], ...)

``scheme`` is a name of :data:`SCHEMES` (what each stores:
:mod:`coreai_partitioner.quantize.schemes`), a :class:`~.schemes.Scheme`, or a
coreai-opt ``QuantizerConfig``.  Every shape is checked against the scheme
first: a weight it cannot store (a 3-channel stem convolution, whose input
channels no int4 block of 32 divides; 16 output channels, which no look-up
table per 32 groups) stays float, and one warning names its layer, why, and
the scheme (:func:`~.checks.keep_unstorable_float`).  ``keep_float=[...]``
names more layers to leave float.

A scheme of :data:`SCHEMES` stores each weight outside the composites on its
own and rewrites the program (:mod:`.store`): the ``int`` schemes give
coreai-opt's integers and scales bit for bit without running its graph-mode
quantizer, the ``palettize*`` schemes k-means look-up tables
(:mod:`.palettize`).  Each quantized weight becomes an int8 or int4 constant
feeding ``coreai.constexpr_blockwise_shift_scale`` (a table's indices feeding
``coreai.lut_to_dense``), which coreai-torch converts as such: the Core AI
asset stores the weight compressed and expands it on device, so the ``.pte``
is really smaller.  Embeddings (and a lm_head tied to one) are int8 per
channel under every scheme.  The composite bodies (the records' own
sub-exports) stay float and keep pairing with their call sites by op target.

A ``QuantizerConfig`` runs coreai-opt (graph mode, built on PT2E), which
re-exports the whole-model program, where every composite call site is one
opaque ``coreai_torch_ext::<op>`` node (:mod:`.coreai_opt`); a configuration
naming a layer inside a composite is an error.

For the ``int`` schemes and a ``QuantizerConfig`` quantize *before*
``run_decompositions``: both find Linear layers by their ``aten.linear``
pattern, which coreai-torch's decomposition table turns into ``permute`` +
``mm``.  A weight they cannot quantize (one read by a bare ``matmul``) is an
error naming its layer (or pass the layer in ``keep_float``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from coreai_partitioner.quantize import schemes
from coreai_partitioner.quantize.checks import check_model, keep_unstorable_float, planned_weights, stored_weights
from coreai_partitioner.quantize.coreai_opt import quantize_with_coreai_opt, quantizer_config
from coreai_partitioner.quantize.schemes import QuantizationError, Scheme
from coreai_partitioner.quantize.store import store_weights
from coreai_partitioner.quantize.weight_forms import DECOMPRESS_OP, LUT_OP

__all__ = [
    "DECOMPRESS_OP",
    "LUT_OP",
    "SCHEMES",
    "QuantizationError",
    "check_model",
    "keep_unstorable_float",
    "planned_weights",
    "quantize",
    "quantizer_config",
    "stored_weights",
    "needs_linear_ops",
    "uses_coreai_opt",
]

#: What each scheme name means (:data:`coreai_partitioner.quantize.schemes.SCHEMES` holds the schemes themselves).
SCHEMES = {name: str(s) for name, s in schemes.SCHEMES.items()}


def uses_coreai_opt(scheme: str | Scheme | Any) -> bool:
    """Whether ``scheme`` runs coreai-opt's quantizer: a ``QuantizerConfig``, not a scheme of :data:`SCHEMES`."""
    return not isinstance(scheme, (str, Scheme))


def needs_linear_ops(scheme: str | Scheme | Any) -> bool:
    """Whether ``scheme`` finds Linear layers by ``aten.linear``, so needs the program before ``run_decompositions``:
    the ``int`` schemes and a coreai-opt ``QuantizerConfig``; the ``palettize*`` schemes take either."""
    return uses_coreai_opt(scheme) or not schemes.scheme(scheme).palettized


def quantize(
    exported_program: ExportedProgram,
    scheme: str | Scheme | Any = "int8",
    *,
    records: Sequence[Any] | None = None,
    example_inputs: tuple[Any, ...] | None = None,
    dynamic_shapes: Any = None,
    keep_float: Sequence[str] = (),
    block_size: int | None = None,
    group_size: int | None = None,
    decompositions: Mapping[Any, Callable[..., Any]] | None = None,
) -> ExportedProgram:
    """Quantize the weights of ``exported_program`` outside its composites; return a program to lower.

    ``exported_program`` is what ``externalize_modules`` returned, not yet run
    through ``run_decompositions`` (a ``palettize*`` scheme takes it either
    way).  ``scheme`` is a name of :data:`SCHEMES`, a :class:`~.schemes.Scheme`
    or a coreai-opt ``QuantizerConfig`` (graph mode; name modules by their
    path in the program, never a module type); ``block_size`` and
    ``group_size`` resize its int4 blocks or look-up table groups.
    ``records`` (the ones ``externalize_modules`` returned) are checked to
    still pair with the quantized program's call sites.  A ``QuantizerConfig``
    re-exports the program: ``example_inputs`` default to the program's own,
    and a program exported with dynamic dimensions needs the same
    ``dynamic_shapes`` again.  ``keep_float`` names layers to leave in floating point
    (module paths, or parameter names); so does a ``scheme`` of
    :data:`SCHEMES` for every weight it cannot store, in one warning naming
    them (:func:`~.checks.keep_unstorable_float`).

    The result is decomposed with ``decompositions`` (coreai-torch's table by
    default, with this package's: :func:`~coreai_partitioner.partition.decompositions.coreai_table`), ready for ``to_edge_transform_and_lower``; its ``module()`` is
    the quantized eager model.  The input program is left as it was.
    """
    if decompositions is None:
        from coreai_partitioner.partition.decompositions import coreai_table

        decompositions = coreai_table()
    if isinstance(scheme, (str, Scheme)):
        scheme = schemes.scheme(scheme, group_size=group_size, block_size=block_size)
        unstorable = keep_unstorable_float(planned_weights(exported_program, scheme, keep_float), scheme.name, stacklevel=2)
        keep_float = [*keep_float, *unstorable]
        return _decomposed(store_weights(exported_program, scheme, records=records, keep_float=keep_float), decompositions)
    return quantize_with_coreai_opt(
        exported_program, scheme, records, example_inputs, dynamic_shapes, keep_float, decompositions
    )


def _decomposed(program: ExportedProgram, decompositions: Mapping[Any, Callable[..., Any]]) -> ExportedProgram:
    """``program`` decomposed with ``decompositions``, unless no op of the table is left in it."""
    from executorch.exir.graph_module import contains_any_call_fn_target_op

    if contains_any_call_fn_target_op(program.graph_module, list(decompositions)):
        with torch.no_grad():
            return program.run_decompositions(decompositions)
    return program
