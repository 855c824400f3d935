"""ATen ops that neither the Core AI converter nor ExecuTorch's portable kernels run, written as ops that one of them does.

coreai-torch 0.4.3 has no lowering for ``median`` and ``adaptive_max_pool2d``/``3d``
(``adaptive_max_pool1d`` exports as the 2-d one), and ExecuTorch 1.5.1's portable
kernels have none either ("Missing operator: aten::median.dim_values" when the
method loads).  ``round(decimals=)`` the converter lowers, the portable kernels
do not.  :func:`fill_kernel_gaps` decomposes them, before ExecuTorch decomposes
the program (``CoreAIPartitioner.transform_for_pre_decomposition``), into
``topk``, ``amax``, ``max`` and ``round``: the delegate takes what the
converter lowers and the portable kernels run the rest.  Each decomposition
computes what eager computes (``median``: the lower of the two middle values;
``round``: ``nearbyint(x * 10**d) / 10**d`` in the input's dtype, ATen's own
arithmetic).  Two ops the converter leaves outside have no portable kernel
either ("Missing operator" when the method loads, error 0x20): ``randn_like``
becomes ``randn`` of its input's size (VITS's noise), and ``_is_all_true``
(a ``torch._check`` on a tensor) becomes ``not any(not x)``.  A pool over a
symbolic spatial size keeps its op: its windows are not known before the
program runs.
"""

from __future__ import annotations

import math

import torch
from torch.export import ExportedProgram

aten = torch.ops.aten


def _median(x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1)
    k = (flat.shape[0] - 1) // 2 + 1
    return aten.topk.default(flat, k, 0, False, True)[0][k - 1]


def _median_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64)
    k = (x.shape[dim] - 1) // 2 + 1
    values, indices = aten.topk.default(x, k, dim, False, True)
    values, indices = values.narrow(dim, k - 1, 1), indices.narrow(dim, k - 1, 1)
    return (values, indices) if keepdim else (values.squeeze(dim), indices.squeeze(dim))


def _round_decimals(x: torch.Tensor, decimals: int) -> torch.Tensor:
    if decimals >= 0:
        scale = 10.0**decimals
        return torch.round(x * scale) / scale
    scale = 10.0**-decimals
    return torch.round(x / scale) * scale


def _windows(size: int, out: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive windows: ``[floor(i * size / out), ceil((i + 1) * size / out))``."""
    return [(i * size // out, math.ceil((i + 1) * size / out)) for i in range(out)]


def _band_max(x: torch.Tensor, dim: int, out: int) -> torch.Tensor:
    """The max over each adaptive window of ``dim``."""
    size = x.shape[dim]
    if size % out == 0:
        shape = (*x.shape[:dim], out, size // out, *x.shape[dim + 1 :])
        return x.reshape(shape).amax(dim + 1)
    return torch.cat([x.narrow(dim, start, end - start).amax(dim, keepdim=True) for start, end in _windows(size, out)], dim)


def _adaptive_max_pool(x: torch.Tensor, output_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    spatial = len(output_size)
    sizes = list(x.shape[-spatial:])
    values = x
    for offset, out in enumerate(output_size):
        values = _band_max(values, x.dim() - spatial + offset, out)
    # the indices (flat over the input's spatial dims, the first max of each window); unread, they are dead code
    cells = [[]]
    for size, out in zip(sizes, output_size):
        cells = [cell + [window] for cell in cells for window in _windows(size, out)]
    lead = x.shape[:-spatial]
    strides = [math.prod(sizes[d + 1 :]) for d in range(spatial)]
    indices = []
    for cell in cells:
        window = x
        for d, (start, end) in enumerate(cell):
            window = window.narrow(x.dim() - spatial + d, start, end - start)
        extents = [end - start for start, end in cell]
        local = window.reshape(*lead, -1).max(-1)[1]
        index = torch.zeros_like(local)
        for d, (start, _) in enumerate(cell):
            inner = math.prod(extents[d + 1 :])
            index = index + (local // inner % extents[d] + start) * strides[d]
        indices.append(index)
    return values, torch.stack(indices, -1).reshape(*lead, *output_size)


def _adaptive_max_pool2d(x: torch.Tensor, output_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return _adaptive_max_pool(x, list(output_size))


def _adaptive_max_pool3d(x: torch.Tensor, output_size: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return _adaptive_max_pool(x, list(output_size))


def _randn_like(x: torch.Tensor, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return torch.randn(x.shape, dtype=x.dtype if dtype is None else dtype, device=x.device if device is None else device)


def _is_all_true(x: torch.Tensor) -> torch.Tensor:
    return torch.logical_not(torch.any(torch.logical_not(x)))


DECOMPOSITIONS = {
    aten.randn_like.default: _randn_like,
    aten._is_all_true.default: _is_all_true,
    aten.median.default: _median,
    aten.median.dim: _median_dim,
    aten.round.decimals: _round_decimals,
    aten.adaptive_max_pool2d.default: _adaptive_max_pool2d,
    aten.adaptive_max_pool3d.default: _adaptive_max_pool3d,
}

_POOLS = (aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)


def fill_kernel_gaps(program: ExportedProgram) -> ExportedProgram:
    """``program`` with the ops of :data:`DECOMPOSITIONS` decomposed (itself when it has none)."""
    found = {node.target for node in program.graph.nodes if node.op == "call_function" and node.target in DECOMPOSITIONS}
    table = {op: DECOMPOSITIONS[op] for op in found if op not in _POOLS or _static_pools(program, op)}
    return program.run_decompositions(table) if table else program


def _static_pools(program: ExportedProgram, op) -> bool:
    return all(
        all(isinstance(size, int) for size in node.args[0].meta["val"].shape)
        for node in program.graph.nodes
        if node.target is op
    )
