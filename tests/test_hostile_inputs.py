"""Every bad input gets a clear answer, the model stays unpatched, nothing half-written stays on disk."""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers import TwoNorms, export_fn, externalize, lower, seeded

from coreai_partitioner import ExternalizeSpec, default_specs, externalize_modules
from coreai_torch.composite_ops import RMSNorm
from helpers import is_patched


class LlamaRMSNormLike(torch.nn.Module):
    """Hugging Face's LlamaRMSNorm, whose forward has no annotations."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * hidden_states * torch.rsqrt(variance + self.variance_epsilon)


class Decoder(torch.nn.Module):
    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.norm(x))


def attempt(model: torch.nn.Module, spec, *sample: torch.Tensor):
    return externalize_modules(model, [spec], export_fn=export_fn(*sample))


def test_unannotated_forward_names_the_class_and_both_ways_out():
    model = Decoder(LlamaRMSNormLike(8))
    with pytest.raises(TypeError) as error:
        attempt(model, ExternalizeSpec(LlamaRMSNormLike, composite_op_name="rms_norm"), torch.randn(2, 8))
    message = str(error.value)
    assert "submodule 'norm' (LlamaRMSNormLike)" in message
    assert "annotate LlamaRMSNormLike.forward" in message
    assert "coreai_torch.composite_ops" in message
    assert not is_patched(model)


class Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        return x * scale


class UsesScaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scaled = Scaled()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scaled(x, 2.0)


def test_non_tensor_argument_is_rejected_at_externalize_naming_it():
    model = UsesScaled()
    with pytest.raises(TypeError, match=r"'scaled' \(Scaled\).*non-tensor argument 'scale' \(float\).*composite_attrs"):
        attempt(model, ExternalizeSpec(Scaled), torch.randn(2, 8))
    assert not is_patched(model)


class Root(torch.nn.Sequential):
    pass


def test_module_path_that_is_not_an_identifier_is_rejected_with_the_fix():
    model = Root(RMSNorm(8), torch.nn.Linear(8, 8))
    with pytest.raises(TypeError, match=r"submodule '0.rmsnorm_impl'.*not an identifier.*named attribute"):
        externalize_modules(model, default_specs(), export_fn=export_fn(torch.randn(2, 8)))
    assert not is_patched(model)


def test_module_with_forward_hooks_is_rejected():
    model = seeded(TwoNorms())
    model.n1.rmsnorm_impl.register_forward_hook(lambda module, args, output: output * 2)
    with pytest.raises(TypeError, match=r"'n1.rmsnorm_impl' \(RMSNormImpl\).*forward hooks"):
        externalize_modules(model, default_specs(), export_fn=export_fn(torch.randn(2, 16)))
    assert not any(hasattr(m, "_original_forward") for m in model.modules())


class Other(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.other_norm = RMSNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.other_norm(x)


@pytest.mark.slow
def test_records_of_another_model_warn_naming_them_and_unrecorded_call_sites_fail():
    x = torch.randn(2, 4, 16)
    ep, _ = externalize(seeded(TwoNorms()), [x])
    _, foreign = externalize(Other(), [x])
    with pytest.warns(UserWarning, match=r"'other_norm.rmsnorm_impl'.*no call site.*different model or an older export"):
        with pytest.raises(RuntimeError, match=r"'n1_rmsnorm_impl'.*has no record.*externalized_modules=records"):
            lower(ep, foreign)


class Gathers(torch.nn.Module):
    """The composite receives an int64 index computed inside the model."""

    def __init__(self) -> None:
        super().__init__()
        self.pick = Pick()

    def forward(self, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return self.pick(x, (i * 2).to(torch.int64))


class Pick(torch.nn.Module):
    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 0, index) * 2.0


@pytest.mark.slow
def test_call_site_with_int64_operands_fails_naming_the_submodule_and_the_fix():
    x, i = torch.randn(4, 8), torch.tensor([0, 1], dtype=torch.int32)
    ep, records = externalize(Gathers(), [x, i], [ExternalizeSpec(Pick)])
    with pytest.raises(RuntimeError, match=r"submodule 'pick'.*not delegated.*torch.int64.*cast it to 32 bits"):
        lower(ep, records)


@pytest.mark.slow
def test_failed_sidecar_write_leaves_no_half_populated_directory(tmp_path, monkeypatch):
    from executorch.backends.apple.coreai import coreai_sidecar_dir

    ep, records = externalize(seeded(TwoNorms()), [torch.randn(2, 4, 16)])
    real_move = shutil.move

    def failing_move(source, destination):
        if str(source).endswith("model.aimodel"):
            real_move(source, destination)  # the bundle lands in the staging dir ...
            raise OSError("disk full")  # ... and then the write fails
        return real_move(source, destination)

    monkeypatch.setattr(shutil, "move", failing_move)
    with pytest.raises(OSError, match="disk full"):
        with coreai_sidecar_dir(str(tmp_path)):
            lower(ep, records, uses_sidecar=True)
    assert list(tmp_path.iterdir()) == []
