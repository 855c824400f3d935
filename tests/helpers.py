"""Shared by the tests: small models, lowering, and running what ships."""

from __future__ import annotations

from pathlib import Path

import tempfile
from collections.abc import Sequence
import numpy as np
import torch
from coreai_torch import get_decomp_table

from coreai_partitioner import export_with_composites, lower_exported
from coreai_partitioner.backends.apple_coreai.runtime import asset_ir as assets
from coreai_partitioner.backends.apple_coreai.runtime.loaded_asset import LoadedAsset
from coreai_partitioner.backends.apple_coreai.runtime.pte import PteContents, read_pte
from coreai_torch.composite_ops import RMSNorm


def export_fn(*sample: torch.Tensor):
    return lambda model: torch.export.export(model, tuple(sample)).run_decompositions(get_decomp_table())


def externalize(model: torch.nn.Module, sample: Sequence[torch.Tensor], specs=None):
    return export_with_composites(model, sample, specs=specs)


def lower(exported_program, records=None, **options):
    return lower_exported((exported_program, records), **options)


def to_pte(lowered) -> PteContents:
    return read_pte(lowered.to_executorch().buffer)


def asset_ir(delegate, sidecar_dir=None) -> str:
    """The Core AI IR of a delegate's shipped asset."""
    with tempfile.TemporaryDirectory() as directory:
        return assets.asset_ir(delegate.asset_path(directory, sidecar_dir=sidecar_dir))


def run_delegate(delegate, *inputs: torch.Tensor, sidecar_dir=None) -> list[np.ndarray]:
    """Run a delegate's shipped asset on the Core AI runtime, inputs in boundary order."""
    with tempfile.TemporaryDirectory() as directory:
        asset = LoadedAsset(delegate.asset_path(directory, sidecar_dir=sidecar_dir))
        try:
            outputs = asset(
                {name: value.detach().numpy() for name, value in zip(asset.input_names, inputs)}
            )
            return [outputs[name] for name in asset.output_names]
        finally:
            asset.close()


def assert_close(actual: np.ndarray, expected: torch.Tensor, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    np.testing.assert_allclose(actual, expected.detach().numpy(), rtol=rtol, atol=atol)


def seeded(module: torch.nn.Module) -> torch.nn.Module:
    """Give every RMSNorm a non-trivial weight, so a dropped scale shows."""
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, RMSNorm):
                sub.weight.uniform_(0.5, 1.5)
    return module.eval()


def two_norms():
    """TwoNorms with seeded norm weights, a sample, and its externalized program and records."""
    model = seeded(TwoNorms())
    x = torch.randn(2, 4, 16)
    ep, records = externalize(model, [x])
    return model, x, ep, records


class TwoNorms(torch.nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.n1 = RMSNorm(dim)
        self.lin = torch.nn.Linear(dim, dim)
        self.n2 = RMSNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.n2(self.lin(self.n1(x)))


class MyLeaf(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-3) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight / (x.abs().mean(-1, keepdim=True) + self.eps)


class SplitByCdist(torch.nn.Module):
    """Two delegates around ``torch.cdist``, which coreai-torch does not lower and ExecuTorch's portable kernels run
    (``_cdist_forward``; a float remainder served so until this package lowered ``remainder.Scalar``)."""

    def __init__(self) -> None:
        super().__init__()
        self.n1 = RMSNorm(16)
        self.lin = torch.nn.Linear(16, 16)
        self.n2 = RMSNorm(16)
        self.n3 = RMSNorm(16)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.n2(self.lin(self.n1(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.head(x)
        return self.n3(hidden + torch.cdist(hidden, hidden).sum(-1, keepdim=True))


class SplitBySort(SplitByCdist):
    """Two delegates around a sort, which neither Core AI nor the pip wheel's portable kernels run."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.n3(torch.sort(self.head(x), dim=-1).values)


def is_patched(model: torch.nn.Module) -> bool:
    """Whether coreai-torch's patching left anything on the model."""
    return any(
        hasattr(m, "_original_forward") or hasattr(m, "_externalize_name") or "forward" in vars(m)
        for m in model.modules()
    )


class Op(torch.nn.Module):
    """A module that calls ``fn``: one op pattern, for the partitioner's per-op tests."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def lower_plain(model: torch.nn.Module, sample: tuple, dynamic_shapes=None):
    """``to_edge_transform_and_lower`` as a deployer calls it for Core AI; the edge manager and the partitioner."""
    from executorch.exir import to_edge_transform_and_lower

    from coreai_partitioner import CoreAIPartitioner, get_default_compile_config, get_default_passes

    partitioner = CoreAIPartitioner()
    edge = to_edge_transform_and_lower(
        torch.export.export(model.eval(), sample, dynamic_shapes=dynamic_shapes),
        partitioner=[partitioner],
        compile_config=get_default_compile_config(),
        transform_passes=get_default_passes(),
    )
    return edge, partitioner


def run_edge(edge, sample: tuple) -> torch.Tensor:
    """The first output of ``edge``'s ``.pte`` on ``sample``, in ExecuTorch's runtime with the Core AI backend."""
    return run_pte(edge.to_executorch().buffer, sample)[0]


class LoadedMethod:
    """A method of a ``.pte`` loaded in ExecuTorch's runtime, with the ``Program`` it came from.

    ExecuTorch's Python ``Method`` does not keep its ``Program`` alive: in
    ``Runtime.get().load_program(pte).load_method("forward").execute(...)``
    the program and its bytes are freed before ``execute``, which then reads
    freed memory (an output planned as ``(1053286901, ERR)``, error 0x10).
    """

    def __init__(self, pte, name: str = "forward") -> None:
        from executorch.runtime import Runtime

        from coreai_partitioner import load_runtime_backend

        load_runtime_backend()
        self.program = Runtime.get().load_program(str(pte) if isinstance(pte, Path) else pte)
        self.method = self.program.load_method(name)

    def execute(self, inputs) -> list:
        return self.method.execute(list(inputs))


def run_pte(pte, inputs, method: str = "forward") -> list:
    """The outputs of ``method`` of a ``.pte`` (its bytes or path) on ``inputs``, in ExecuTorch's runtime."""
    return LoadedMethod(pte, method).execute(inputs)
