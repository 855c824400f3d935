"""ExecuTorch export recipes that keep Core AI composites: ``CoreAICompositeRecipeType``.

    import coreai_partitioner.recipes as recipes          # registers the recipes
    from executorch.export import ExportRecipe
    recipe = ExportRecipe.get_recipe(recipes.CoreAICompositeRecipeType.FP16)
    session = recipes.export(model, [(x,)], export_recipe=recipe)   # executorch.export.export's arguments
    save_pte(session.get_executorch_program_manager(), "model.pte")

The ``.pte`` is byte for byte the one :func:`coreai_partitioner.lower` with
the recipe's options and :func:`coreai_partitioner.save_pte` write:

* ``FP32``, ``FP16``: the model's floating weights and sample in that dtype
  (``lower(model, sample, dtype=torch.float16)``; the model is left as it is);
* ``INT8_WEIGHT_ONLY``, ``INT4_WEIGHT_ONLY``, ``INT4_CHANNEL_WEIGHT_ONLY``,
  ``PALETTIZE4_WEIGHT_ONLY``, ``PALETTIZE8_WEIGHT_ONLY``,
  ``PALETTIZE4_MIXED_WEIGHT_ONLY``: weights outside the composites stored
  compressed by :func:`coreai_partitioner.quantize.quantize`
  (``lower(model, sample, quantize="int8")``, ``"int4"``, ``"int4-channel"``,
  ``"palettize4"``, ``"palettize8"``, ``"palettize4-mixed"``).

``ExportRecipe.get_recipe(recipe_type, **options)`` takes ``lower``'s
options: ``specs``, ``dtype`` (for the quantized recipes), ``keep_float``,
and every :class:`CoreAIPartitioner` option.  The provider's backend name is
``coreai_composite``, apart from upstream's ``coreai``.

Why :func:`export` and not ``executorch.export.export``: composites are
externalized *while* the model is exported (coreai-torch patches the
submodules, and each call site's record is sub-exported from the patched
model), and the partitioner needs those records.  ExecuTorch's own
``TORCH_EXPORT`` stage runs a plain ``torch.export.export``, and its
lowering stage holds partitioners built before any export, so neither can
carry them.  :func:`export` builds the same ``ExportSession`` and replaces
those two stages (:class:`CompositeExportStage`, :class:`CompositeLowerStage`);
``executorch.export.export`` with one of these recipes stops after its
``torch.export`` with an error saying so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from executorch.export import (
    BackendRecipeProvider,
    ExportRecipe,
    ExportSession,
    RecipeType,
    StageType,
    recipe_registry,
)
from executorch.export.stages import PipelineArtifact, Stage

from coreai_partitioner import _compat
from coreai_partitioner.lowering.lower import export_with_composites, lower_exported

BACKEND_NAME = "coreai_composite"

__all__ = [
    "BACKEND_NAME",
    "CompositeExportStage",
    "CompositeLowerStage",
    "CoreAICompositeExportRecipe",
    "CoreAICompositeRecipeProvider",
    "CoreAICompositeRecipeType",
    "export",
]


class CoreAICompositeRecipeType(RecipeType):
    """Core AI recipes whose delegates keep externalized composites."""

    FP32 = "coreai_composite_fp32"
    FP16 = "coreai_composite_fp16"
    INT8_WEIGHT_ONLY = "coreai_composite_int8_weight_only"
    INT4_WEIGHT_ONLY = "coreai_composite_int4_weight_only"
    INT4_CHANNEL_WEIGHT_ONLY = "coreai_composite_int4_channel_weight_only"
    PALETTIZE4_WEIGHT_ONLY = "coreai_composite_palettize4_weight_only"
    PALETTIZE8_WEIGHT_ONLY = "coreai_composite_palettize8_weight_only"
    PALETTIZE4_MIXED_WEIGHT_ONLY = "coreai_composite_palettize4_mixed_weight_only"

    @classmethod
    def get_backend_name(cls) -> str:
        return BACKEND_NAME


#: ``export_with_composites`` options each recipe fixes.
_EXPORT_OPTIONS = {
    CoreAICompositeRecipeType.FP32: {"dtype": torch.float32},
    CoreAICompositeRecipeType.FP16: {"dtype": torch.float16},
    CoreAICompositeRecipeType.INT8_WEIGHT_ONLY: {"quantize": "int8"},
    CoreAICompositeRecipeType.INT4_WEIGHT_ONLY: {"quantize": "int4"},
    CoreAICompositeRecipeType.INT4_CHANNEL_WEIGHT_ONLY: {"quantize": "int4-channel"},
    CoreAICompositeRecipeType.PALETTIZE4_WEIGHT_ONLY: {"quantize": "palettize4"},
    CoreAICompositeRecipeType.PALETTIZE8_WEIGHT_ONLY: {"quantize": "palettize8"},
    CoreAICompositeRecipeType.PALETTIZE4_MIXED_WEIGHT_ONLY: {"quantize": "palettize4-mixed"},
}
_EXPORT_KEYS = ("specs", "dtype", "keep_float")


@dataclasses.dataclass
class CoreAICompositeExportRecipe(ExportRecipe):
    """An ``ExportRecipe`` that also says how to export with composites and how to partition.

    ``export_options`` go to :func:`export_with_composites` (per method),
    ``partitioner_options`` to each method's :class:`CoreAIPartitioner`.
    """

    export_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    partitioner_options: dict[str, Any] = dataclasses.field(default_factory=dict)


class CoreAICompositeRecipeProvider(BackendRecipeProvider):
    @property
    def backend_name(self) -> str:
        return BACKEND_NAME

    def get_supported_recipes(self) -> Sequence[RecipeType]:
        return list(CoreAICompositeRecipeType)

    def create_recipe(self, recipe_type: RecipeType, **options: Any) -> CoreAICompositeExportRecipe | None:
        if recipe_type not in _EXPORT_OPTIONS:
            return None
        fixed = _EXPORT_OPTIONS[recipe_type]
        clash = sorted(set(options) & set(fixed))
        if clash:
            raise ValueError(f"{recipe_type.name} sets {', '.join(clash)} itself; choose another recipe instead")
        export_options = {**fixed, **{key: options.pop(key) for key in _EXPORT_KEYS if key in options}}
        _check_partitioner_options(options)
        return CoreAICompositeExportRecipe(
            name=recipe_type.value,
            aten_transform_passes=[_refuse_plain_export(recipe_type)],
            strict=False,  # what lower() exports with
            export_options=export_options,
            partitioner_options=options,
        )


def _check_partitioner_options(options: dict[str, Any]) -> None:
    """Build one partitioner now: an unknown option fails here, before any export."""
    from coreai_partitioner.partition.partitioner import CoreAIPartitioner

    try:
        CoreAIPartitioner(**options)
    except TypeError as error:
        raise ValueError(
            f"a Core AI composite recipe takes specs, dtype, keep_float and CoreAIPartitioner's options; {error}"
        ) from None


def _refuse_plain_export(recipe_type: RecipeType) -> Callable[[str, Any], Any]:
    def refuse(method: str, program: Any) -> Any:
        raise ValueError(
            f"{recipe_type} externalizes Core AI composites while the model is exported, which "
            "executorch.export.export's own torch.export stage cannot do; call "
            "coreai_partitioner.recipes.export(...) with the same arguments"
        )

    return refuse


class CompositeExportStage(Stage):
    """``TORCH_EXPORT``: :func:`export_with_composites` per method; the records go in the context."""

    def __init__(self, export_options: dict[str, Any]) -> None:
        super().__init__()
        self._options = export_options

    @property
    def stage_type(self) -> StageType:
        return StageType.TORCH_EXPORT

    @property
    def valid_predecessor_stages(self) -> list[StageType]:
        return [StageType.SOURCE_TRANSFORM, StageType.QUANTIZE]

    @property
    def can_start_pipeline(self) -> bool:
        return True

    def run(self, artifact: PipelineArtifact) -> None:
        example_inputs = artifact.get_context("example_inputs")
        dynamic_shapes = artifact.get_context("dynamic_shapes") or {}
        programs, records = {}, {}
        for method, model in artifact.data.items():
            if not example_inputs.get(method):
                raise ValueError(f"no example inputs for method {method!r}; pass example_inputs={{{method!r}: [(...)]}}")
            programs[method], records[method] = export_with_composites(
                model, example_inputs[method][0], dynamic_shapes=dynamic_shapes.get(method), **self._options
            )
        self._artifact = artifact.copy_with_new_data(programs)
        self._artifact.add_context("coreai_records", records)


class CompositeLowerStage(Stage):
    """``TO_EDGE_TRANSFORM_AND_LOWER``: :func:`lower_exported` with each method's records."""

    def __init__(self, partitioner_options: dict[str, Any]) -> None:
        super().__init__()
        self._options = partitioner_options

    @property
    def stage_type(self) -> StageType:
        return StageType.TO_EDGE_TRANSFORM_AND_LOWER

    @property
    def valid_predecessor_stages(self) -> list[StageType]:
        return [StageType.TORCH_EXPORT]

    @property
    def can_start_pipeline(self) -> bool:
        return False

    def run(self, artifact: PipelineArtifact) -> None:
        records = artifact.get_context("coreai_records")
        lowered = lower_exported(
            {method: (program, records[method]) for method, program in artifact.data.items()},
            constant_methods=artifact.get_context("constant_methods"),
            generate_etrecord=artifact.get_context("generate_etrecord", False),
            **self._options,
        )
        self._artifact = artifact.copy_with_new_data(lowered)
        _compat.add_delegation_info(self._artifact, lowered)


def export(
    model: torch.nn.Module | dict[str, torch.nn.Module],
    example_inputs: list[tuple[Any, ...]] | dict[str, list[tuple[Any, ...]]] | None = None,
    export_recipe: ExportRecipe | None = None,
    name: str | None = None,
    dynamic_shapes: Any = None,
    constant_methods: dict[str, Any] | None = None,
    artifact_dir: str | None = None,
    generate_etrecord: bool = False,
) -> ExportSession:
    """``executorch.export.export`` for a :class:`CoreAICompositeRecipeType` recipe; returns the finished session."""
    if not isinstance(export_recipe, CoreAICompositeExportRecipe):
        raise ValueError(
            f"export_recipe is {type(export_recipe).__name__}, not a Core AI composite recipe; pass "
            "ExportRecipe.get_recipe(CoreAICompositeRecipeType.<...>) (ExportRecipe.combine drops what it needs), "
            "or use executorch.export.export for other recipes"
        )
    models = model.values() if isinstance(model, dict) else [model]
    if not all(isinstance(m, torch.nn.Module) and not isinstance(m, torch.fx.GraphModule) for m in models):
        raise ValueError(
            "a Core AI composite recipe exports the eager model (nn.Module): its composites are externalized "
            "while it is exported; pass the model, not an ExportedProgram or GraphModule"
        )
    session = ExportSession(
        model=model,
        example_inputs=example_inputs,
        export_recipe=dataclasses.replace(export_recipe, aten_transform_passes=None),
        name=name,
        dynamic_shapes=dynamic_shapes,
        constant_methods=constant_methods,
        artifact_dir=artifact_dir,
        generate_etrecord=generate_etrecord,
    )
    session.register_stage(StageType.TORCH_EXPORT, CompositeExportStage(export_recipe.export_options))
    session.register_stage(StageType.TO_EDGE_TRANSFORM_AND_LOWER, CompositeLowerStage(export_recipe.partitioner_options))
    session.export()
    return session


recipe_registry.register_backend_recipe_provider(CoreAICompositeRecipeProvider())
