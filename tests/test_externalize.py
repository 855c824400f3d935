"""The front door: externalize_modules, default_specs and spec_for."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from helpers import TwoNorms, export_fn, is_patched

from coreai_partitioner import ExternalizeSpec, default_specs, externalize_modules, spec_for
from coreai_torch import composite_ops


def test_model_is_unpatched_after_externalizing():
    model = TwoNorms()
    externalize_modules(model, default_specs(), export_fn=export_fn(torch.randn(2, 16)))
    assert not is_patched(model)


def test_model_is_unpatched_and_the_error_kept_when_export_fn_raises():
    model = TwoNorms()

    def failing_export(m):
        m(torch.randn(2, 16))  # runs the patched forward
        raise KeyError("from the caller's export_fn")

    with pytest.raises(KeyError, match="from the caller's export_fn"):
        externalize_modules(model, default_specs(), export_fn=failing_export)
    assert not is_patched(model)


def test_dynamic_dims_stay_dynamic():
    model = TwoNorms()
    x = torch.randn(2, 8, 16)
    seq = torch.export.Dim("seq", min=2, max=64)
    ep, records = externalize_modules(
        model,
        default_specs(),
        export_fn=lambda m: torch.export.export(m, (x,), dynamic_shapes=({1: seq},)),
    )
    (x_node,) = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name == "x"]
    assert isinstance(x_node.meta["val"].shape[1], torch.SymInt)
    assert all(
        isinstance(r.exported_program.graph.find_nodes(op="placeholder")[0].meta["val"].shape[1], torch.SymInt)
        for r in records
    )


def composite_leaves() -> list[type]:
    """Classes of coreai_torch.composite_ops whose default instances carry a version."""
    leaves = []
    for name in composite_ops.__all__:
        cls = getattr(composite_ops, name)
        required = [
            p
            for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
            if p.default is inspect.Parameter.empty
        ]
        if required:
            continue  # wrappers such as RMSNorm(dim) hold a leaf, they are not one
        if hasattr(cls(), "version"):
            leaves.append(cls)
    return leaves


def test_default_specs_cover_every_composite_leaf_with_its_public_attributes():
    specs = {spec.target_class: spec for spec in default_specs()}
    assert set(specs) == set(composite_leaves())
    for cls, spec in specs.items():
        instance = cls()
        public = {
            name
            for name in vars(instance)
            if not name.startswith("_") and name not in ("training", "version")
        }
        assert set(spec.composite_attrs) == public, cls
        assert all(hasattr(instance, attr) for attr in spec.composite_attrs)


def test_default_composite_names():
    assert {s.target_class.__name__: s.composite_op_name for s in default_specs()} == {
        "RMSNormImpl": "rms_norm",
        "RoPE": "rope",
        "SDPA": "scaled_dot_product_attention",
        "GatherMM": "gather_mm",
        "GatedDeltaUpdate": "gated_delta_update",
    }


def test_spec_for_by_composite_name_or_class_name():
    assert spec_for("rms_norm").target_class is composite_ops.RMSNormImpl
    assert spec_for("SDPA").composite_op_name == "scaled_dot_product_attention"
    spec = spec_for("rope")
    spec.composite_attrs.append("mutated")
    assert "mutated" not in spec_for("rope").composite_attrs
    with pytest.raises(KeyError, match="known: .*rms_norm"):
        spec_for("layer_norm")


class Plain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_a_model_without_composites_is_silent_and_own_targets_it_lacks_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        externalize_modules(Plain(), default_specs(), export_fn=export_fn(torch.randn(2, 4)))
    with pytest.warns(UserWarning, match="target.*TwoNorms match no submodule of Plain"):
        externalize_modules(Plain(), [ExternalizeSpec(TwoNorms)], export_fn=export_fn(torch.randn(2, 4)))


def test_unmatched_default_specs_are_silent_but_unmatched_own_specs_warn():
    x = torch.randn(2, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        externalize_modules(TwoNorms(), default_specs(), export_fn=export_fn(x))

    with pytest.warns(UserWarning, match="target.*Plain match no submodule of TwoNorms"):
        externalize_modules(TwoNorms(), default_specs() + [ExternalizeSpec(Plain)], export_fn=export_fn(x))
