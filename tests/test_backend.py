"""The partitioner's and backend's contract: ids, build-time records, options, errors."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from executorch.exir import to_edge
from helpers import asset_ir, assert_close, lower, run_delegate, seeded, to_pte, two_norms

from coreai_partitioner import CoreAIPartitioner, do_not_delegate, get_default_compile_config, verify
from coreai_partitioner.backends.apple_coreai import BACKEND_ID, CoreAICompositeBackend
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte
from coreai_torch.composite_ops import RMSNorm

pytestmark = pytest.mark.slow


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=600,
    )


LOWER_IN_SUBPROCESS = """
    import torch
    from coreai_torch.composite_ops import RMSNorm
    from executorch.exir import to_edge_transform_and_lower
    from coreai_partitioner import CoreAIPartitioner, externalize_modules, default_specs, get_default_compile_config
    from coreai_torch import get_decomp_table
    from executorch.exir.backend.backend_details import BackendDetails

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = RMSNorm(8)
        def forward(self, x):
            return self.norm(x)

    x = torch.randn(2, 8)
    ep, records = externalize_modules(M(), default_specs(), export_fn=lambda m: torch.export.export(m, (x,)).run_decompositions(get_decomp_table()))
    program = to_edge_transform_and_lower(ep, partitioner=[CoreAIPartitioner(externalized_modules=records)], compile_config=get_default_compile_config()).to_executorch()
    ids = [d.id for plan in program.executorch_program.execution_plan for d in plan.delegates]
    names = [c.__name__ for c in BackendDetails.__subclasses__()]
    print(ids, names.count("CoreAICompositeBackend"), "CoreAIBackend" in names)
"""


@pytest.mark.parametrize("upstream_first", [True, False])
def test_backend_id_resolves_to_this_backend_whatever_the_import_order(upstream_first):
    upstream = "import executorch.backends.apple.coreai.compiler.preprocess\n"
    ours = "import coreai_partitioner.backends.apple_coreai\n"  # the package itself imports nothing
    prelude = upstream + ours if upstream_first else ours + upstream
    result = run_python(prelude + textwrap.dedent(LOWER_IN_SUBPROCESS))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "['CoreAICompositeBackend'] 1 True"


def test_backend_id_is_the_one_the_runtime_registers_and_names_one_class():
    from executorch.exir.backend.backend_details import BackendDetails

    assert BACKEND_ID == "CoreAICompositeBackend"
    by_name = [c for c in BackendDetails.__subclasses__() if c.__name__ == BACKEND_ID]
    assert by_name == [CoreAICompositeBackend]


def test_records_travel_in_no_compile_spec():
    _, _, ep, records = two_norms()
    program = lower(ep, records).to_executorch()

    delegates = [d for plan in program.executorch_program.execution_plan for d in plan.delegates]
    assert [list(d.compile_specs) for d in delegates] == [[]]


def test_a_call_site_reaching_the_backend_without_a_record_names_it_and_the_fix():
    _, _, ep, _ = two_norms()
    edge = to_edge(ep, compile_config=get_default_compile_config()).exported_program()
    with pytest.raises(RuntimeError, match=r"coreai_torch_ext::n1_rmsnorm_impl_.*without a record.*externalized_modules=records"):
        CoreAICompositeBackend.preprocess(edge, [])


def test_preprocess_called_directly_leaves_the_callers_program_as_it_was():
    from executorch.exir.lowered_backend_module import get_lowered_backend_modules

    _, _, ep, records = two_norms()
    (module,) = get_lowered_backend_modules(lower(ep, records).exported_program().graph_module)
    program = module.original_module
    before = [(node.name, node.target) for node in program.graph.nodes]

    CoreAICompositeBackend.preprocess(program, [])

    assert [(node.name, node.target) for node in program.graph.nodes] == before


def test_copied_records_lower_like_the_originals():
    import copy

    model, x, ep, records = two_norms()
    for copied in (copy.copy(records), copy.deepcopy(records)):
        assert type(copied) is type(records) and copied.module_paths() == records.module_paths()
    verify.check(lower(ep, copy.deepcopy(records)), model, x).raise_for_mismatch()


def test_call_site_without_a_record_fails_naming_the_op_the_submodule_and_the_fix():
    _, _, ep, _ = two_norms()
    with pytest.raises(RuntimeError) as error:
        lower(ep, None)
    message = str(error.value)
    assert "coreai_torch_ext::n1_rmsnorm_impl_" in message
    assert "'n1_rmsnorm_impl'" in message  # the submodule path, as far as the op name tells
    assert "externalized_modules=records" in message


def test_records_pickled_elsewhere_give_a_clear_error():
    _, _, _, records = two_norms()
    unpickled = pickle.loads(pickle.dumps(records))
    with pytest.raises(RuntimeError, match=r"n1\.rmsnorm_impl.*pickled in process.*externalize_modules in the process that lowers"):
        CoreAIPartitioner(externalized_modules=unpickled)


def test_records_whose_ops_are_not_registered_here_give_a_clear_error():
    _, _, _, records = two_norms()
    stale = [type(records[0])(**{**vars(records[0]), "op_name": "never_registered_0123abcd"})]
    with pytest.raises(RuntimeError, match="not registered in this process"):
        CoreAIPartitioner(externalized_modules=stale)


class MarkCallSitesDoNotDelegate:
    def __call__(self, graph_module):
        for node in graph_module.graph.nodes:
            if "coreai_torch_ext" in str(node.target):
                do_not_delegate(node)
        return None


def test_call_site_marked_do_not_delegate_is_never_left_as_an_unrunnable_op():
    from executorch.exir import to_edge_transform_and_lower

    _, _, ep, records = two_norms()
    with pytest.raises(RuntimeError, match=r"'n1\.rmsnorm_impl'.*do_not_delegate"):
        to_edge_transform_and_lower(
            ep,
            partitioner=[CoreAIPartitioner(externalized_modules=records)],
            compile_config=get_default_compile_config(),
            transform_passes=[MarkCallSitesDoNotDelegate()],
        )


def test_legacy_to_edge_then_to_backend_keeps_upstreams_clear_error():
    _, _, ep, records = two_norms()
    edge = to_edge(ep, compile_config=get_default_compile_config())
    with pytest.raises(RuntimeError, match="must be used with to_edge_transform_and_lower"):
        edge.to_backend(CoreAIPartitioner(externalized_modules=records))


def test_sidecar_delivery_writes_the_asset_beside_the_pte_and_runs(tmp_path):
    from executorch.backends.apple.coreai import coreai_sidecar_dir

    model, x, ep, records = two_norms()
    with coreai_sidecar_dir(str(tmp_path)):
        pte = to_pte(lower(ep, records, uses_sidecar=True))

    (delegate,) = pte.delegates
    assert delegate.packaging == "sidecar" and delegate.files == {}
    assert (tmp_path / delegate.manifest["path"] / "main.mlirb").is_file()
    (out,) = run_delegate(delegate, x, sidecar_dir=tmp_path)
    assert_close(out, model(x))


def test_sidecar_directory_left_by_an_earlier_build_is_rejected(tmp_path):
    from executorch.backends.apple.coreai import coreai_sidecar_dir

    _, _, ep, records = two_norms()
    (tmp_path / "0123").mkdir()
    with pytest.raises(RuntimeError, match="already holds assets"):
        with coreai_sidecar_dir(str(tmp_path)):
            lower(ep, records, uses_sidecar=True)


def test_sidecar_without_its_directory_fails_before_writing_anything(monkeypatch):
    _, _, ep, records = two_norms()
    monkeypatch.delenv("COREAI_SIDECAR_DIR", raising=False)
    with pytest.raises(ValueError, match="COREAI_SIDECAR_DIR"):
        lower(ep, records, uses_sidecar=True)


@pytest.mark.skipif(sys.platform == "darwin", reason="xcrun exists on macOS")
def test_aot_compilation_off_macos_fails_at_the_build_step_with_upstreams_error():
    from executorch.backends.apple.coreai import AOTCompileConfig

    _, _, ep, records = two_norms()
    # The constructor accepts it (upstream's does too): only the build step needs macOS.
    partitioner_options = dict(aot_compile_config=AOTCompileConfig(platform="iOS"))
    with pytest.raises(RuntimeError, match="xcrun coreai-build. not found.*macOS"):
        lower(ep, records, **partitioner_options)


def test_min_deployment_version_reaches_the_manifest():
    _, _, ep, records = two_norms()
    (delegate,) = to_pte(lower(ep, records, min_deployment_version="27")).delegates
    assert delegate.manifest["min_deployment_version"] == "27.0"
    compile_specs = lower(ep, records, min_deployment_version="27").to_executorch()
    (spec,) = compile_specs.executorch_program.execution_plan[0].delegates[0].compile_specs
    assert (spec.key, bytes(spec.value)) == ("coreai_min_deployment_version", b"27")


def test_unknown_min_deployment_version_is_rejected():
    _, _, ep, records = two_norms()
    with pytest.raises(ValueError, match="unsupported min_deployment_version"):
        lower(ep, records, min_deployment_version="12")


def debug_asm(delegate) -> str:
    """The delegate's asset printed with its op locations (``asset_ir`` leaves them out)."""
    import tempfile

    from coreai.authoring import AIModelAsset

    from coreai_partitioner._compat import program_asm

    with tempfile.TemporaryDirectory() as directory:
        return program_asm(AIModelAsset.load(delegate.asset_path(directory)).program, locations=True)


@pytest.mark.parametrize("level", ["none", "op_ids", "full"])
def test_debug_info_keeps_source_paths_only_when_asked_for_full(level):
    import inspect

    from helpers import TwoNorms

    model, x, ep, records = two_norms()
    lowered = lower(ep, records, debug_info=level)
    (delegate,) = to_pte(lowered).delegates
    asm = debug_asm(delegate)
    assert (inspect.getsourcefile(TwoNorms) in asm) == (level == "full")
    assert ('"op_id"' in asm) == (level != "none")
    verify.check(lowered, model, x).raise_for_mismatch()
    specs = {s.key: bytes(s.value) for s in lowered.to_executorch().executorch_program.execution_plan[0].delegates[0].compile_specs}
    assert specs.get("coreai_debug_info") == (None if level == "none" else level.encode())


def test_unknown_debug_info_level_is_rejected_naming_the_levels():
    with pytest.raises(ValueError, match="debug_info='verbose' is not one of 'none', 'op_ids', 'full'"):
        CoreAIPartitioner(debug_info="verbose")


class Dynamic(torch.nn.Module):
    """No reshape, so a dynamic sequence length keeps it one delegate."""

    def __init__(self) -> None:
        super().__init__()
        self.n1 = RMSNorm(16)
        self.n2 = RMSNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.n2(torch.tanh(self.n1(x)))


def test_input_enumerations_specialize_the_delegate_per_shape():
    from coreai_torch import get_decomp_table

    from coreai_partitioner import default_specs, externalize_modules

    model = seeded(Dynamic())
    x = torch.randn(2, 8, 16)
    seq = torch.export.Dim("seq", min=2, max=64)
    ep, records = externalize_modules(
        model,
        default_specs(),
        export_fn=lambda m: torch.export.export(m, (x,), dynamic_shapes=({1: seq},)).run_decompositions(
            get_decomp_table()
        ),
    )

    (delegate,) = to_pte(lower(ep, records, input_enumerations=[{1: [4, 8]}])).delegates

    ir = asset_ir(delegate)
    specialized = [line for line in ir.splitlines() if line.lstrip().startswith("coreai.graph @main")]
    assert len(specialized) == 2, specialized
    assert "tensor<2x4x16xf32>" in ir and "tensor<2x8x16xf32>" in ir
    assert ir.count("coreai.invoke") == 4  # two call sites in each specialization
    assert json.loads(delegate.payload)["packaging"] == "inline"


def delegate_program(model: torch.nn.Module, *sample: torch.Tensor):
    from executorch.exir.lowered_backend_module import get_lowered_backend_modules

    lowered = lower(torch.export.export(model, sample))
    (module,) = get_lowered_backend_modules(lowered.exported_program().graph_module)
    return module.original_module


def test_boundary_check_rejects_a_delegate_whose_io_differs_from_what_executorch_feeds():
    from coreai_partitioner.backends.apple_coreai.convert import convert
    from coreai_partitioner.backends.apple_coreai.io_compat import assert_io_compatible
    from coreai_partitioner.records.programs import with_own_graph

    x = torch.randn(2, 8)
    narrow = delegate_program(torch.nn.Linear(8, 4).eval(), x)
    wide = delegate_program(torch.nn.Linear(8, 5).eval(), x)
    program = convert(with_own_graph(narrow))

    assert_io_compatible(program, narrow)
    with pytest.raises(ValueError, match=r"output 0 dim 1: static shape mismatch \(\.aimodel=4, ExecuTorch=5\)"):
        assert_io_compatible(program, wide)


def test_aot_delivery_embeds_each_architectures_bundle(monkeypatch):
    """AOT compilation needs macOS; coreai-build is replaced by one writing bundles, as upstream's tests do."""
    from pathlib import Path

    from executorch.backends.apple.coreai import AOTCompileConfig
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    from coreai_partitioner import _compat

    def fake_coreai_build(aimodel: Path, out: Path, options: dict) -> None:
        assert (aimodel / "main.mlirb").is_file() and options["platform"] == "iOS"
        for arch in ("h16", "h17"):
            (out / f"model.{arch}.aimodelc").mkdir()
            (out / f"model.{arch}.aimodelc" / "model.bin").write_bytes(arch.encode())

    monkeypatch.setattr(_compat, "run_coreai_build", fake_coreai_build)
    edge = delegate_program(torch.nn.Linear(8, 4).eval(), torch.randn(2, 8))
    spec = CompileSpec("coreai_aot_compile_config", AOTCompileConfig(platform="iOS").to_json().encode())

    result = CoreAICompositeBackend.preprocess(edge, [spec])

    manifest = json.loads(result.processed_bytes)
    assert manifest["packaging"] == "aot_compiled_inline"
    assert manifest["archs"] == {arch: f"{manifest['hash']}/model.{arch}.aimodelc" for arch in ("h16", "h17")}
    keys = set(result.data_store_output.pte_data)
    assert keys == {f"coreai/{manifest['hash']}/model.{arch}.aimodelc/model.bin" for arch in ("h16", "h17")}


class MaskedByProduct(torch.nn.Module):
    """Two boolean masks combined with `*`, as Hugging Face's sliding-window masks are."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * ((x > 0) * (x < 1)).to(x.dtype)


def test_boolean_products_stay_outside_the_delegate_and_the_program_runs():
    from coreai_partitioner.verify.testing import assert_lowers_and_matches

    assert_lowers_and_matches(MaskedByProduct(), torch.randn(4, 8), specs=[])


def test_a_large_asset_streams_into_the_pte_from_disk(tmp_path, monkeypatch):
    import tempfile

    from coreai_partitioner.backends.apple_coreai.deliver import IN_MEMORY_MAX_BYTES
    from coreai_partitioner.lowering.lower import save_pte

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the asset waits for write_to_file
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Tanh()).eval()  # 2 MiB of weights
    x = torch.randn(2, 512)
    lowered = lower(torch.export.export(model, (x,)))
    waiting = list(tmp_path.glob(".coreai_asset_*"))
    assert waiting and max(p.stat().st_size for p in waiting) > IN_MEMORY_MAX_BYTES

    path = save_pte(lowered, tmp_path / "model.pte")  # the asset copied by the kernel (KernelCopiedData)
    assert path.read_bytes() == lowered.to_executorch().buffer  # as upstream's in-memory serialization
    verify.check(path, model, x).raise_for_mismatch()
    (delegate,) = read_pte(path).delegates
    assert max(len(data) for data in delegate.files.values()) == max(p.stat().st_size for p in waiting)


class SizeReadOutside(torch.nn.Module):
    def forward(self, x):
        y = x * 2.0
        return y.reshape(1, x.shape[1], 2, -1) + 1.0  # the reshape is kept outside below; it reads T


class KeepReshapesOutside:
    def __call__(self, graph_module):
        for node in graph_module.graph.nodes:
            if "view" in str(node.target):
                do_not_delegate(node)


@pytest.mark.slow
def test_a_size_read_inside_and_outside_a_delegate_never_crosses_its_boundary():
    from executorch.exir import to_edge_transform_and_lower

    from coreai_partitioner import get_default_passes

    tokens = torch.export.Dim("T", min=2, max=8)
    ep = torch.export.export(SizeReadOutside(), (torch.randn(1, 4, 6),), dynamic_shapes=({1: tokens},))
    lowered = to_edge_transform_and_lower(
        ep,
        partitioner=[CoreAIPartitioner()],
        compile_config=get_default_compile_config(),
        transform_passes=[KeepReshapesOutside(), *get_default_passes()],
    )
    # was: "output 0: tensor/non-tensor mismatch (.aimodel=si32, ExecuTorch feeds SymInt)"
    x = torch.randn(1, 5, 6)
    verify.check(lowered, SizeReadOutside()(x), x).raise_for_mismatch()


def test_a_symbolic_scalar_only_a_delegate_can_compute_and_an_outside_op_reads_is_an_error_naming_it():
    from coreai_partitioner.partition.partitioner import raise_on_symbolic_outputs

    class Model(torch.nn.Module):
        def forward(self, x):
            y = x.nonzero()  # its length is known only once y is computed
            return y.new_zeros(y.shape[0]) + 1

    program = torch.export.export(Model(), (torch.ones(4),))
    graph = program.graph
    inside = {"nonzero", "sym_size_int_1"}
    for node in graph.nodes:
        if node.name in inside:
            node.meta["delegation_tag"] = "tag0"
    assert any(n.name == "sym_size_int_1" for n in graph.nodes), [n.name for n in graph.nodes]
    with pytest.raises(RuntimeError, match=r"node sym_size_int_1 \(u0\) is computed inside a Core AI delegate and read outside it by .*new_zeros"):
        raise_on_symbolic_outputs(graph)


def test_every_reader_of_a_size_gets_its_own_sym_size():
    from coreai_partitioner.lowering.passes import SplitSymbolicSizes

    class Model(torch.nn.Module):
        def forward(self, x):
            n = x.shape[0]
            return x.reshape(n, -1), x.new_ones(n)

    dim = torch.export.Dim("N", min=2, max=8)
    program = torch.export.export(Model(), (torch.ones(4, 3),), dynamic_shapes=({0: dim},)).run_decompositions({})
    sizes = lambda: [n for n in program.graph.nodes if n.target is torch.ops.aten.sym_size.int]  # noqa: E731
    assert len(sizes()) == 1 and len(sizes()[0].users) == 2
    assert SplitSymbolicSizes()(program.graph_module).modified
    assert len(sizes()) == 2 and all(len(n.users) == 1 for n in sizes())
    reshaped, ones = program.module()(torch.ones(5, 3))
    assert reshaped.shape == (5, 3) and ones.shape == (5,)
