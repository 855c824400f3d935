"""How far fp16 and fp32 ops on the Core AI Linux CPU runtime are from fp64, against PyTorch's.

    python benchmarks/fp16_accumulation.py > benchmarks/results/fp16_accumulation.txt   # about a minute

Each row is one op, converted by coreai-torch alone (``TorchConverter``, no
ExecuTorch, no composites) and run through coreai-core, so the figures are the
runtime's own.  Errors are the largest absolute error over the largest
``|y|``; the last column is the unit roundoff ``u`` of the dtype times
``sqrt(K)``, what a sum of K rounded terms drifts by.  The finding this
explains: matmuls accumulate in fp16 on this runtime, so their error grows
with the reduced length K (about ``u * sqrt(K)``), while reductions (sum,
mean, softmax) do not.  That is why an fp16 ``.pte`` of a wide decoder is
further from fp32 on Linux than PyTorch's fp16 eager is
(``tests/test_llm_scale.py``); it is not the lowering.  ``--verify``'s
tolerance is built on it (``coreai_partitioner/verify/fidelity.py``,
``runtime_threshold``).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore")


class Linear(torch.nn.Module):
    def __init__(self, k: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(k, 1024, bias=False)

    def forward(self, x):
        return self.linear(x)


class MeanOfSquares(torch.nn.Module):
    def forward(self, x):
        return (x * x).mean(-1, keepdim=True)


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)


class MatMul(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


def relative_errors(module: torch.nn.Module, *inputs: torch.Tensor, dtype: torch.dtype = torch.float16) -> tuple[float, float]:
    """(Core AI runtime, PyTorch) error of ``module`` at ``dtype`` against its fp64 result."""
    from coreai_torch import TorchConverter, get_decomp_table

    from coreai_partitioner.backends.apple_coreai.runtime.loaded_asset import LoadedAsset

    module = module.to(dtype).eval()
    halves = tuple(x.to(dtype) for x in inputs)
    program = torch.export.export(module, halves).run_decompositions(get_decomp_table())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "op.aimodel"
        with contextlib.redirect_stdout(io.StringIO()):  # coreai-torch prints its progress
            TorchConverter().add_exported_program(program).to_coreai().save_asset(path)
        asset = LoadedAsset(path)
        (got,) = asset({name: x.numpy() for name, x in zip(asset.input_names, halves)}).values()
        asset.close()
    with torch.no_grad():
        eager = module(*halves).double()
        exact = module.double()(*(x.to(dtype).double() for x in inputs))
    scale = exact.abs().max()
    return float((torch.from_numpy(got).double() - exact).abs().max() / scale), float((eager - exact).abs().max() / scale)


def main() -> None:
    torch.manual_seed(0)
    rows = [(f"linear, K={k}", k, Linear(k), (torch.randn(16, k),)) for k in (64, 1024, 3072)]
    rows += [
        ("q @ k^T, K=128", 128, MatMul(), (torch.randn(1, 16, 16, 128), torch.randn(1, 16, 128, 2048))),
        ("p @ v, K=2048", 2048, MatMul(), (torch.softmax(torch.randn(1, 16, 16, 2048), -1), torch.randn(1, 16, 2048, 128))),
        ("mean(x^2), 1024", None, MeanOfSquares(), (3 * torch.randn(16, 1024),)),
        ("softmax, 2048", None, Softmax(), (4 * torch.randn(16, 2048),)),
        ("silu, 1024", None, torch.nn.SiLU(), (4 * torch.randn(16, 1024),)),
    ]
    for dtype, name, roundoff in ((torch.float16, "fp16", 2.0**-11), (torch.float32, "fp32", 2.0**-24)):
        print(f"{'op (' + name + ')':18}  {'Core AI runtime':>15}  {'PyTorch':>8}  {'ratio':>7}  {'u sqrt(K)':>9}")
        for label, k, module, inputs in rows:
            coreai, eager = relative_errors(module, *inputs, dtype=dtype)
            bound = f"{roundoff * k**0.5:9.1e}" if k else ""
            print(f"{label:18}  {coreai:15.1e}  {eager:8.1e}  {coreai / max(eager, 1e-30):6.2f}x  {bound:>9}".rstrip())
        print()


if __name__ == "__main__":
    main()
