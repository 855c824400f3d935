"""Rules for data-dependent sizes: a size ``torch.export`` could not bound from the inputs' shapes.

``nonzero``, boolean-mask indexing (``y[y > 0]``) and a size read with
``item()`` give a tensor a size known only once the program runs (an
*unbacked* symbol, ``u0``).  coreai-torch converts a claimed node whose
size is one wrong or dies on it: boolean-mask indexing lowers to a gather
of the wrong rank ("aten_index_tensor[0]: rank 3 vs 1"), an ``arange``
sized by ``n.item()`` hands the delegate the size as an input it cannot
type ("'SymInt' object has no attribute 'dtype'"), and a delegate cannot
return a size read inside it.  So a node that takes, makes or is sized by
such a symbol stays outside, on the portable kernels, as XNNPACK leaves them;
what it computes before and after is claimed as usual.
"""

from __future__ import annotations

import torch

from coreai_partitioner import _compat
from coreai_partitioner.partition.claims import EVERY_OP, refuses, value


@refuses(EVERY_OP)
def data_dependent_size(node: torch.fx.Node) -> str | None:
    for operand in (node, *node.all_input_nodes):
        symbols = _compat.unbacked_symbols(value(operand))
        if symbols:
            whose = "its result" if operand is node else operand.name
            return (
                f"{whose} has a data-dependent size ({', '.join(sorted(map(str, symbols)))}): the converter gets a "
                "size known only at run time wrong (boolean-mask indexing, nonzero, a size read with item())"
            )
    return None
