"""How far fp16 ops on the Core AI Linux CPU runtime are from fp64, against PyTorch's fp16.

    python benchmarks/fp16_accumulation.py      # prints the table; about half a minute

Each row is one op, converted by coreai-torch alone (``TorchConverter``, no
ExecuTorch, no composites) and run through coreai-core, so the figures are the
runtime's own.  Errors are the largest absolute error over the largest
``|y|``.  The finding this explains: matmuls accumulate in fp16 on this
runtime, so their error grows with the reduced length K, while reductions
(sum, mean, softmax) do not.  That is why an fp16 ``.pte`` of a wide decoder
is further from fp32 on Linux than PyTorch's fp16 eager is
(``tests/test_llm_scale.py``); it is not the lowering.
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


def relative_errors(module: torch.nn.Module, *inputs: torch.Tensor) -> tuple[float, float]:
    """(Core AI runtime, PyTorch) fp16 error of ``module`` against its fp64 result."""
    from coreai_torch import TorchConverter, get_decomp_table

    from coreai_partitioner.backends.apple_coreai.runtime.loaded_asset import LoadedAsset

    module = module.half().eval()
    halves = tuple(x.half() for x in inputs)
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
        exact = module.double()(*(x.double() for x in inputs))
    scale = exact.abs().max()
    return float((torch.from_numpy(got).double() - exact).abs().max() / scale), float((eager - exact).abs().max() / scale)


def main() -> None:
    torch.manual_seed(0)
    rows = [(f"linear, K={k}", Linear(k), (torch.randn(16, k),)) for k in (64, 1024, 3072)]
    rows += [
        ("q @ k^T, K=128", MatMul(), (torch.randn(1, 16, 16, 128), torch.randn(1, 16, 128, 2048))),
        ("p @ v, K=2048", MatMul(), (torch.softmax(torch.randn(1, 16, 16, 2048), -1), torch.randn(1, 16, 2048, 128))),
        ("mean(x^2), 1024", MeanOfSquares(), (3 * torch.randn(16, 1024),)),
        ("softmax, 2048", Softmax(), (4 * torch.randn(16, 2048),)),
    ]
    print(f"{'op (fp16)':18}  {'Core AI runtime':>15}  {'PyTorch':>8}  ratio")
    for name, module, inputs in rows:
        coreai, eager = relative_errors(module, *inputs)
        print(f"{name:18}  {coreai:15.1e}  {eager:8.1e}  {coreai / eager:5.1f}x")


if __name__ == "__main__":
    main()
