"""Externalized composites through to_edge_transform_and_lower, run on the Core AI runtime."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import (
    MyLeaf,
    SplitBySort,
    asset_ir,
    assert_close,
    externalize,
    lower,
    run_delegate,
    seeded,
    to_pte,
    two_norms,
)
from tiny_transformer import Block, TinyTransformer

from coreai_partitioner import ExternalizeSpec, _compat, spec_for, verify
from coreai_torch.composite_ops import RMSNorm

pytestmark = pytest.mark.slow


def rename_every_call(exported_program, prefix: str = "renamed_"):
    """A caller's transform between externalize_modules and lowering."""
    for node in exported_program.graph.nodes:
        if node.op == "call_function":
            node.name = prefix + node.name
    exported_program.graph_module.recompile()
    return exported_program


def test_two_rms_norms_survive_the_to_edge_rename_and_match_eager():
    model, x, ep, records = two_norms()

    pte = to_pte(lower(ep, records))

    (delegate,) = pte.delegates
    assert delegate.backend_id == "CoreAICompositeBackend"
    ir = asset_ir(delegate)
    assert 'composite_declaration<"rms_norm"' in ir
    assert "noinline" in ir
    assert ir.count("coreai.invoke") == 2
    (out,) = run_delegate(delegate, x)
    assert_close(out, model(x))


def test_renaming_transform_between_externalize_and_lowering_still_lowers():
    model, x, ep, records = two_norms()
    rename_every_call(ep)

    # Without re-resolution, the converter sees call sites no lowering is registered for.
    with pytest.raises(ValueError, match="unable to handle call function op"):
        _compat.TorchConverter().add_exported_program(
            ep, _externalized_exported_programs=list(records)
        ).to_coreai()

    (delegate,) = to_pte(lower(ep, records)).delegates
    assert asset_ir(delegate).count("coreai.invoke") == 2
    (out,) = run_delegate(delegate, x)
    assert_close(out, model(x))


def test_records_are_not_mutated_and_lower_again():
    model, x, ep, records = two_norms()
    before = [list(r.source_nodes) for r in records]

    lower(ep, records)
    assert [list(r.source_nodes) for r in records] == before

    (delegate,) = to_pte(lower(ep, records)).delegates
    (out,) = run_delegate(delegate, x)
    assert_close(out, model(x))


class DropsOneCallSite:
    """A transform that removes the second call site of the shared norm (no rename)."""

    def __call__(self, exported_program):
        graph = exported_program.graph
        sites = [n for n in graph.nodes if "coreai_torch_ext" in str(n.target)]
        second = sites[1]
        second.replace_all_uses_with(second.args[0])
        graph.erase_node(second)
        exported_program.graph_module.recompile()
        return exported_program


class SharedNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm(16)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.norm(x), self.norm(y)


def test_call_site_count_mismatch_warns_and_pairs_the_remaining_call_site_by_signature():
    model = seeded(SharedNorm())
    x, y = torch.randn(2, 4, 16), torch.randn(2, 4, 16)
    ep, records = externalize(model, [x, y])
    DropsOneCallSite()(ep)

    with pytest.warns(UserWarning, match=r"'norm\.rmsnorm_impl'.*1 call site.*2 record"):
        lowered = lower(ep, records)

    (delegate,) = to_pte(lowered).delegates
    (out,) = run_delegate(delegate, x)
    assert_close(out, model.norm(x))


class SwapsCallSites:
    """A transform that moves the second call site of the shared norm ahead of the first."""

    def __call__(self, exported_program):
        first, second = [n for n in exported_program.graph.nodes if "coreai_torch_ext" in str(n.target)]
        first.prepend(second)
        exported_program.graph_module.recompile()
        return exported_program


def test_call_sites_reordered_by_a_pass_pair_with_the_sub_export_of_their_own_shape():
    model = seeded(SharedNorm())
    x, y = torch.randn(2, 4, 16), torch.randn(3, 7, 16)
    ep, records = externalize(model, [x, y])
    SwapsCallSites()(ep)

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # nothing mismatched: no warning
        lowered = lower(ep, records)

    (delegate,) = to_pte(lowered).delegates
    ir = asset_ir(delegate)
    assert "tensor<2x4x16xf32>" in ir and "tensor<3x7x16xf32>" in ir
    verify.check(lowered, model, x, y).raise_for_mismatch()


def test_one_instance_called_twice_with_different_shapes():
    model = seeded(SharedNorm())
    x, y = torch.randn(2, 4, 16), torch.randn(3, 7, 16)
    ep, records = externalize(model, [x, y])
    assert len(records) == 2

    (delegate,) = to_pte(lower(ep, records)).delegates

    ir = asset_ir(delegate)
    assert ir.count("coreai.invoke") == 2
    assert "tensor<2x4x16xf32>" in ir and "tensor<3x7x16xf32>" in ir
    out_x, out_y = run_delegate(delegate, x, y)
    ref_x, ref_y = model(x, y)
    assert_close(out_x, ref_x)
    assert_close(out_y, ref_y)


class OneBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block(dim=32, heads=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def test_nested_externalization_block_around_composites():
    model = seeded(OneBlock())
    x = torch.randn(1, 8, 32)
    specs = [ExternalizeSpec(Block), spec_for("rms_norm"), spec_for("scaled_dot_product_attention")]
    ep, records = externalize(model, [x], specs)
    assert sorted(records.module_paths()) == [
        "block",
        "block.attn.sdpa",
        "block.attn_norm.rmsnorm_impl",
        "block.mlp_norm.rmsnorm_impl",
    ]

    (delegate,) = to_pte(lower(ep, records)).delegates

    ir = asset_ir(delegate)
    assert ir.count("coreai.invoke") == 4  # the block in main, three composites inside it
    assert 'composite_declaration<"rms_norm"' in ir
    assert 'composite_declaration<"scaled_dot_product_attention"' in ir
    (out,) = run_delegate(delegate, x)
    assert_close(out, model(x))


def test_mixed_composites_in_a_transformer():
    model = TinyTransformer(layers=2, dim=32, heads=4, kv_heads=2).eval()
    tokens = torch.randint(0, 128, (1, 12), dtype=torch.int32)
    ep, records = externalize(model, [tokens])

    (delegate,) = to_pte(lower(ep, records)).delegates

    ir = asset_ir(delegate)
    assert ir.count("coreai.invoke") == len(records) == 7
    assert 'composite_declaration<"rms_norm"' in ir
    assert 'composite_declaration<"scaled_dot_product_attention"' in ir
    (out,) = run_delegate(delegate, tokens)
    assert_close(out, model(tokens))


class UsesMyLeaf(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = MyLeaf(16)
        self.b = MyLeaf(16, eps=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def test_user_defined_composite():
    model = UsesMyLeaf().eval()
    x = torch.randn(2, 3, 16)
    spec = ExternalizeSpec(MyLeaf, composite_op_name="my_leaf", composite_attrs=["eps"])
    ep, records = externalize(model, [x], [spec])

    (delegate,) = to_pte(lower(ep, records)).delegates

    ir = asset_ir(delegate)
    assert ir.count('composite_declaration<"my_leaf"') == 2  # eps differs: two declarations
    assert ir.count("coreai.invoke") == 2
    (out,) = run_delegate(delegate, x)
    assert_close(out, model(x))


def test_model_without_externalization_lowers_with_the_backend_fix_alone():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    ep = torch.export.export(model, (x,))

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        (delegate,) = to_pte(lower(ep)).delegates

    assert "coreai.invoke" not in asset_ir(delegate)
    (out,) = run_delegate(delegate, x)
    assert_close(out, model(x))





def test_graph_split_by_an_unsupported_op_yields_two_assets_each_with_its_own_composites():
    model = seeded(SplitBySort())
    x = torch.randn(2, 4, 16)
    ep, records = externalize(model, [x])

    pte = to_pte(lower(ep, records))

    first, second = pte.delegates
    assert first.manifest["hash"] != second.manifest["hash"]
    first_ir, second_ir = asset_ir(first), asset_ir(second)
    assert first_ir.count("coreai.invoke") == 2 and second_ir.count("coreai.invoke") == 1
    assert "n3.rmsnorm_impl" in second_ir and "n3.rmsnorm_impl" not in first_ir
    assert "n1.rmsnorm_impl" in first_ir and "n1.rmsnorm_impl" not in second_ir

    head = model.head(x)
    (out_first,) = run_delegate(first, x)
    assert_close(out_first, head)
    (out_second,) = run_delegate(second, torch.sort(head, dim=-1).values)
    assert_close(out_second, model(x))


class SharedNormAcrossABreak(torch.nn.Module):
    """One norm instance called on both sides of an op no Core AI delegate takes."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        y = y * ((y > 0) * (y < 1)).to(y.dtype)  # a boolean product stays outside every delegate
        return self.norm(y)


def test_one_instances_call_sites_in_two_delegates_each_take_their_own_record():
    model = seeded(SharedNormAcrossABreak())
    x = torch.randn(2, 4, 16)
    ep, records = externalize(model, [x])

    lowered = lower(ep, records)

    pte = to_pte(lowered)
    assert len(pte.delegates) == 2
    assert all(asset_ir(d).count("coreai.invoke") == 1 for d in pte.delegates)
    verify.check(lowered, model, x).raise_for_mismatch()


def test_two_methods_from_two_exports_lower_with_one_partitioner_each():
    from executorch.exir import to_edge_transform_and_lower

    from coreai_partitioner import CoreAIPartitioner, get_default_compile_config, get_default_passes

    model = TinyTransformer(layers=1, dim=32, heads=2).eval()
    short, long = torch.randint(0, 128, (1, 4)), torch.randint(0, 128, (1, 8))
    programs, records = {}, {}
    for name, sample in (("short", short), ("long", long)):
        programs[name], records[name] = externalize(model, [sample])

    lowered = to_edge_transform_and_lower(
        programs,
        partitioner={name: [CoreAIPartitioner(externalized_modules=r)] for name, r in records.items()},
        compile_config=get_default_compile_config(),
        transform_passes=get_default_passes(),
    )

    for name, sample in (("short", short), ("long", long)):
        verify.check(lowered, model, sample, method=name).raise_for_mismatch()
