"""ExecuTorch export recipes of our own (coreai_partitioner.recipes): the .pte is lower()'s, byte for byte."""

from __future__ import annotations

import pytest
import torch
from executorch.export import ExportRecipe, recipe_registry
from helpers import TwoNorms, seeded
from requires import require

from coreai_partitioner import lower, recipes, save_pte
from coreai_partitioner.lowering.precision import floating_as
from coreai_partitioner.recipes import CoreAICompositeRecipeType as Recipe


def test_the_recipes_register_under_their_own_backend_name_beside_upstreams_coreai():
    import executorch.backends.apple.coreai.recipes  # noqa: F401 - upstream's provider, named "coreai"

    assert {"coreai", "coreai_composite"} <= set(recipe_registry.list_backends())
    assert list(recipe_registry.get_supported_recipes("coreai_composite")) == list(Recipe)
    assert all(r.value.startswith("coreai_composite_") for r in Recipe)


@pytest.mark.parametrize(
    "recipe, options",
    [(Recipe.FP32, {"dtype": torch.float32}), (Recipe.FP16, {"dtype": torch.float16}),
     (Recipe.INT8_WEIGHT_ONLY, {"quantize": "int8"}), (Recipe.INT4_WEIGHT_ONLY, {"quantize": "int4"}),
     (Recipe.INT4_CHANNEL_WEIGHT_ONLY, {"quantize": "int4-channel"}), (Recipe.PALETTIZE4_WEIGHT_ONLY, {"quantize": "palettize4"}),
     (Recipe.PALETTIZE8_WEIGHT_ONLY, {"quantize": "palettize8"}),
     (Recipe.PALETTIZE4_MIXED_WEIGHT_ONLY, {"quantize": "palettize4-mixed"})],
)
def test_each_recipe_exports_with_its_own_dtype_or_scheme_and_lowers_with_the_given_options(recipe, options):
    built = ExportRecipe.get_recipe(recipe, min_deployment_version="27", keep_float=["head"])
    assert built.name == recipe.value
    assert built.export_options == {**options, "keep_float": ["head"]}
    assert built.partitioner_options == {"min_deployment_version": "27"}


def test_a_recipe_option_it_sets_itself_or_does_not_know_is_refused_before_any_export():
    with pytest.raises(ValueError, match="FP16 sets dtype itself"):
        ExportRecipe.get_recipe(Recipe.FP16, dtype=torch.float32)
    with pytest.raises(ValueError, match="CoreAIPartitioner's options.*bogus"):
        ExportRecipe.get_recipe(Recipe.FP32, bogus=1)


def test_recipes_export_refuses_another_recipe_and_an_already_exported_model():
    model, x = TwoNorms(), torch.randn(2, 4, 16)
    with pytest.raises(ValueError, match="not a Core AI composite recipe"):
        recipes.export(model, [(x,)], export_recipe=ExportRecipe(name="other"))
    with pytest.raises(ValueError, match="exports the eager model"):
        recipes.export(torch.export.export(model, (x,)), [(x,)], export_recipe=ExportRecipe.get_recipe(Recipe.FP32))


def test_lower_refuses_an_unknown_scheme_and_a_dtype_that_is_not_floating_before_exporting():
    model, x = TwoNorms(), torch.randn(2, 4, 16)
    with pytest.raises(ValueError, match="quantize='int3' is not a scheme"):
        lower(model, (x,), quantize="int3")
    with pytest.raises(ValueError, match="dtype=torch.int8 is not a floating dtype"):
        lower(model, (x,), dtype=torch.int8)


def test_floating_as_casts_inside_the_block_keeps_tied_weights_tied_and_gives_the_model_back():
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))
    model[1].weight = torch.nn.Parameter(torch.randn(8, 4))
    model[0].weight = model[1].weight  # tied
    original = model[0].weight
    with floating_as(model, torch.float16):
        assert model[0].weight.dtype == torch.float16 and model[0].weight is model[1].weight
        assert model[1].bias.dtype == torch.float16
    assert model[0].weight is original and model[1].weight is original and model[1].bias.dtype == torch.float32


def pte_of_session(session, path):
    with open(path, "wb") as file:
        session.get_executorch_program_manager().write_to_file(file)
    return path.read_bytes()


EQUIVALENT = {
    Recipe.FP32: {"dtype": torch.float32},
    Recipe.FP16: {"dtype": torch.float16},
    Recipe.INT8_WEIGHT_ONLY: {"quantize": "int8"},
    Recipe.INT4_WEIGHT_ONLY: {"quantize": "int4"},
    Recipe.PALETTIZE4_WEIGHT_ONLY: {"quantize": "palettize4"},
}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(EQUIVALENT), ids=[r.name for r in EQUIVALENT])
def test_a_recipes_pte_is_byte_for_byte_lowers_with_the_same_options(recipe, tmp_path):
    require("coreai_opt", "quantize")
    model, x = seeded(TwoNorms(dim=64)), torch.randn(2, 4, 64)
    session = recipes.export(model, [(x,)], export_recipe=ExportRecipe.get_recipe(recipe))
    ours = pte_of_session(session, tmp_path / "recipe.pte")
    assert ours == save_pte(lower(model, (x,), **EQUIVALENT[recipe]), tmp_path / "lower.pte").read_bytes()
    assert model.lin.weight.dtype == torch.float32  # the model is left as it was


@pytest.mark.slow
def test_an_fp16_recipe_pte_runs_in_executorchs_runtime_like_eager(tmp_path):
    from coreai_partitioner import verify

    model, x = seeded(TwoNorms()), torch.randn(2, 4, 16)
    session = recipes.export(model, [(x,)], export_recipe=ExportRecipe.get_recipe(Recipe.FP16))
    path = tmp_path / "model.pte"
    pte_of_session(session, path)
    (out,) = verify.run(path, x.half())
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), model(x).detach(), rtol=2e-2, atol=2e-2)


@pytest.mark.slow
def test_a_two_method_recipe_export_keeps_each_methods_composites_and_gives_its_etrecord(tmp_path):
    from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte

    models = {"first": seeded(TwoNorms()), "second": seeded(TwoNorms(dim=8))}
    inputs = {"first": [(torch.randn(2, 4, 16),)], "second": [(torch.randn(1, 3, 8),)]}
    session = recipes.export(models, inputs, export_recipe=ExportRecipe.get_recipe(Recipe.FP32), generate_etrecord=True)
    contents = read_pte(pte_of_session(session, tmp_path / "model.pte"))
    assert sorted(contents.methods) == ["first", "second"]
    assert all(len(contents.coreai_delegates(method)) == 1 for method in models)
    delegates = session.get_etrecord()._delegate_map
    assert {"call_n1_rmsnorm_impl_0", "call_n2_rmsnorm_impl_0"} <= set(list(delegates["second"].values())[0]["delegate_map"])


@pytest.mark.slow
def test_executorchs_own_export_with_a_composite_recipe_stops_with_the_fix():
    import executorch.export

    model, x = TwoNorms(), torch.randn(2, 4, 16)
    with pytest.raises(ValueError, match=r"call coreai_partitioner\.recipes\.export\(\.\.\.\) with the same arguments"):
        executorch.export.export(model, [(x,)], export_recipe=ExportRecipe.get_recipe(Recipe.FP32))
