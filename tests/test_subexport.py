"""Identical call sites are exported once, bound to each instance's own weights."""

from __future__ import annotations

import pytest

import re

import torch
from helpers import asset_ir, export_fn, externalize, lower, to_pte
from helpers import MyLeaf
from tiny_transformer import TinyTransformer

from coreai_partitioner import ExternalizeSpec, default_specs, externalize_modules, verify
from coreai_partitioner.records.fake import memoized
from coreai_torch.composite_ops import RMSNorm

LEAF = ExternalizeSpec(MyLeaf, composite_op_name="my_leaf", composite_attrs=["eps"])


def normalized(ir: str) -> str:
    """IR with the per-build names (uuid suffixes, resource keys) blanked."""
    ir = re.sub(r"_[0-9a-f]{8}\b", "_X", ir)
    ir = re.sub(r"(resource_|dense_resource<)[0-9a-z_]+", r"\1X", ir)
    return re.sub(r"\{-#.*", "", ir, flags=re.S)


@pytest.mark.slow
def test_identical_call_sites_are_exported_once_with_the_same_ir_and_numerics():
    model = TinyTransformer(layers=3, dim=32, heads=4).eval()
    tokens = torch.randint(0, 128, (1, 8), dtype=torch.int32)
    sample = (tokens,)

    ep, shared = externalize(model, sample)
    ep_each, each = externalize_modules(model, default_specs(), export_fn=export_fn(*sample), reuse_exports=False)

    assert len(shared) == len(each) == 10  # 3 blocks of (norm, sdpa, norm), and the final norm
    assert shared.sub_exports == 2  # one RMSNorm, one SDPA
    assert each.sub_exports == 10
    lowered = lower(ep, shared)
    (delegate,) = to_pte(lowered).delegates
    (delegate_each,) = to_pte(lower(ep_each, each)).delegates
    assert normalized(asset_ir(delegate)) == normalized(asset_ir(delegate_each))
    verify.check(lowered, model, tokens).raise_for_mismatch()


class TwoLeaves(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = MyLeaf(16)
        self.b = MyLeaf(16)
        with torch.no_grad():
            self.b.weight.mul_(-3.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


@pytest.mark.slow
def test_shared_export_binds_each_call_site_to_its_own_instances_weights():
    model = TwoLeaves().eval()
    x = torch.randn(2, 3, 16)
    ep, records = externalize(model, [x], [LEAF])

    assert records.sub_exports == 1
    weights = {r.name.rsplit("_", 1)[0]: r.exported_program.state_dict["weight"] for r in records}
    assert weights["a"] is model.a.weight and weights["b"] is model.b.weight
    assert records[0].exported_program.graph is not records[1].exported_program.graph
    verify.check(lower(ep, records), model, x).raise_for_mismatch()


class OffsetLeaf(MyLeaf):
    """Behaviour depends on a plain tensor attribute, which no key can see into."""

    def __init__(self, dim: int, offset: float) -> None:
        super().__init__(dim)
        self.offset = torch.tensor(offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + self.offset


class ListLeaf(MyLeaf):
    def __init__(self, dim: int, scales: list[float]) -> None:
        super().__init__(dim)
        self.scales = scales

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.scales[0]


class Pair(torch.nn.Module):
    def __init__(self, first: torch.nn.Module, second: torch.nn.Module) -> None:
        super().__init__()
        self.first = first
        self.second = second

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


def doubled(module, args, output):
    return output * 2


def unshareable_pairs():
    hooked = MyLeaf(16)
    hooked.register_forward_hook(doubled)
    own_forward = MyLeaf(16)
    own_forward.forward = lambda x, m=own_forward: MyLeaf.forward(m, x) - 1.0
    return {
        "tensor attribute": Pair(OffsetLeaf(16, 0.0), OffsetLeaf(16, 5.0)),
        "list attribute": Pair(ListLeaf(16, [1.0]), ListLeaf(16, [-2.0])),
        "forward hook": Pair(MyLeaf(16), hooked),
        "instance forward": Pair(MyLeaf(16), own_forward),
    }


@pytest.mark.slow
def test_modules_with_state_outside_the_key_are_never_shared():
    x = torch.randn(2, 3, 16)
    for reason in ("tensor attribute", "list attribute"):
        model = unshareable_pairs()[reason]
        spec = ExternalizeSpec(type(model.first), composite_op_name="my_leaf", composite_attrs=["eps"])
        ep, records = externalize(model.eval(), [x], [spec])
        assert records.sub_exports == 2, reason
        verify.check(lower(ep, records), model, x).raise_for_mismatch()


def test_call_site_key_refuses_instance_forwards_hooks_and_unknown_attributes():
    from types import SimpleNamespace

    from coreai_partitioner.records.subexport import call_site_key

    def prep(module):
        node = SimpleNamespace(args=(object(),), kwargs={})
        return SimpleNamespace(
            module=module, source_nodes=[node], composite_op_name=None,
            fake_inputs=(torch.empty(2, 16),), dynamic_shapes=(None,),
        )

    assert call_site_key(prep(MyLeaf(16))) is not None
    assert call_site_key(prep(MyLeaf(16))) == call_site_key(prep(MyLeaf(16)))
    assert call_site_key(prep(MyLeaf(16, eps=0.5))) != call_site_key(prep(MyLeaf(16)))
    for reason, pair in unshareable_pairs().items():
        assert call_site_key(prep(pair.second)) is None, reason


@pytest.mark.slow
def test_one_instance_with_two_shapes_is_exported_twice():
    class Shapes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = RMSNorm(16)

        def forward(self, x, y):
            return self.norm(x), self.norm(y)

    _, records = externalize(Shapes(), [torch.randn(2, 4, 16), torch.randn(3, 16)])
    assert records.sub_exports == 2


def test_call_sites_that_trace_alike_run_their_forward_once_in_the_trace(monkeypatch):
    """The fake impls of call sites that would sub-export to one graph (same class, attributes, weight shapes) share
    what they learned: three leaves alike cost the export as many forwards as one leaf with another eps (which
    shares neither their memo nor their sub-export)."""
    runs = []
    forward = MyLeaf.forward

    def counted(self, x: torch.Tensor) -> torch.Tensor:
        runs.append(self)
        return forward(self, x)

    monkeypatch.setattr(MyLeaf, "forward", counted)

    class Leaves(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.alike = torch.nn.ModuleList([MyLeaf(16) for _ in range(3)])
            self.other = MyLeaf(16, eps=1e-2)

        def forward(self, x):
            for leaf in self.alike:
                x = leaf(x)
            return self.other(x)

    model = Leaves().eval()
    x = torch.randn(2, 5, 16)
    program, records = externalize(model, (x,), [LEAF])
    assert len(records) == 4 and records.sub_exports == 2
    alike = sum(any(run is leaf for leaf in model.alike) for run in runs)
    assert alike == sum(run is model.other for run in runs) >= 1
    torch.testing.assert_close(program.module()(x), model(x))


def test_memoized_fake_impl_runs_the_forward_once_per_input_signature():
    calls = []

    def forward(x, y, extra=None):
        calls.append(1)
        return x @ y

    fake = memoized(forward)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        a, b = mode.from_tensor(torch.empty(2, 3)), mode.from_tensor(torch.empty(3, 5))
        first = fake(a, b)
        second = fake(a, b)
        third = fake(mode.from_tensor(torch.empty(4, 3)), b)
    assert len(calls) == 2
    assert second.shape == first.shape == (2, 5) and third.shape == (4, 5)
    assert second.stride() == first.stride() and second.dtype == first.dtype
    with FakeTensorMode() as mode:  # a list or tuple argument is not memoized, and does not break the key
        fake(mode.from_tensor(torch.empty(2, 3)), mode.from_tensor(torch.empty(3, 5)), (1, 2, 3))
    assert len(calls) == 3


def test_the_sub_exports_list_torchs_keepable_ops_once_and_leave_torch_as_it_was(monkeypatch):
    """Each sub-export's ``run_decompositions`` asks torch for the CompositeImplicitAutograd ops it can keep, walking
    every operator namespace (two or three times a sub-export); the sub-exports of one externalization ask once."""
    from torch._export import utils
    from torch.export import decomp_utils, exported_program

    calls = []
    listed = utils._collect_all_valid_cia_ops

    def counted():
        calls.append(1)
        return listed()

    for module in (utils, decomp_utils, exported_program):
        monkeypatch.setattr(module, "_collect_all_valid_cia_ops", counted)
    model = TinyTransformer(layers=2, dim=32, heads=4).eval()
    sample = (torch.randint(0, 128, (1, 8), dtype=torch.int32),)
    # The whole model exported without decomposing, so that only the sub-exports ask.
    _, records = externalize_modules(model, default_specs(), export_fn=lambda m: torch.export.export(m, sample))
    assert records.sub_exports == 2  # one RMSNorm, one SDPA
    assert len(calls) == 1
    assert decomp_utils._collect_all_valid_cia_ops is counted and exported_program._collect_all_valid_cia_ops is counted


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 16))

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None, scale: torch.Tensor | None = None) -> torch.Tensor:
        y = x * self.weight
        y = y if bias is None else y + bias
        return y if scale is None else y * scale


def test_a_call_site_that_skips_an_optional_argument_is_exported_with_the_rest_by_keyword():
    """coreai-torch exports a call site whose optional argument in the middle is None with the later ones by keyword
    (``_compat.call_site_arguments``, its logic mirrored for the one-trace sub-export)."""

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scaled = Scaled()

        def forward(self, x, s):
            return self.scaled(x, None, s)

    model = Model().eval()
    x, s = torch.randn(2, 16), torch.randn(2, 16)
    program, records = externalize(model, (x, s), [ExternalizeSpec(Scaled, composite_op_name="scaled")])
    (record,) = records
    assert [spec.arg.name for spec in record.exported_program.graph_signature.input_specs if spec.kind.name == "USER_INPUT"] == ["x", "scale"]
    torch.testing.assert_close(record.exported_program.module()(x, scale=s), model(x, s))
    torch.testing.assert_close(program.module()(x, s), model(x, s))


def test_call_sites_are_found_in_one_walk_as_coreai_torch_finds_them():
    from coreai_torch import _utils
    from coreai_torch import externalize as marked

    from coreai_partitioner import _compat

    program, records = externalize(TwoLeaves(), [torch.randn(2, 16)], [LEAF])
    walk = marked._find_all_custom_op_nodes
    with _compat.call_sites_found_in_one_walk(program):
        for record in records:
            found = marked._find_all_custom_op_nodes(program, record.op_name)
            assert found == _utils._find_all_custom_op_nodes(program, record.op_name) and len(found) == 1
        assert marked._find_all_custom_op_nodes(program, "no_such_op") == []
    assert marked._find_all_custom_op_nodes is walk
