"""The same model lowered twice gives a byte-identical .pte, in one process or in two."""

from __future__ import annotations

import pytest

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from coreai_partitioner.verify.testing import assert_lowers_and_matches

pytestmark = pytest.mark.slow

BUILD = textwrap.dedent(
    """
    import sys, hashlib, torch
    sys.path[:0] = {paths!r}
    from helpers import externalize, lower
    from test_lowering import OneBlock, SharedNorm, MyLeaf
    from tiny_transformer import Block
    from coreai_partitioner import ExternalizeSpec, default_specs

    class Everything(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.nested = OneBlock()
            self.shared = SharedNorm()
            self.leaf = MyLeaf(32)

        def forward(self, x):
            y = self.nested(x)
            a, b = self.shared(y[..., :16], y[..., 16:])
            return self.leaf(torch.cat([a, b], dim=-1))

    def build():
        torch.manual_seed(0)
        model = Everything().eval()
        specs = default_specs() + [ExternalizeSpec(Block), ExternalizeSpec(MyLeaf, composite_op_name="my_leaf", composite_attrs=["eps"])]
        ep, records = externalize(model, [torch.randn(1, 8, 32)], specs)
        return bytes(lower(ep, records).to_executorch().buffer)

    def build_int4():
        # int4 weights are sub-byte blobs: named weight_<n> like every other weight, not after a per-process hash.
        from helpers import TwoNorms
        from coreai_partitioner import externalize_modules, lower_exported
        from coreai_partitioner.quantize import quantize

        torch.manual_seed(0)
        program, records = externalize_modules(
            TwoNorms(64).eval(), default_specs(), export_fn=lambda m: torch.export.export(m, (torch.randn(2, 64),))
        )
        program = quantize(program, "int4", records=records)
        return bytes(lower_exported((program, records)).to_executorch().buffer)

    def build_decoder():
        # GQA: coreai-core used to fold the SDPA composite's repeated-head index into a constant named per process.
        from transformers import AutoModelForCausalLM
        from coreai_partitioner import text_generation

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(text_generation.tiny_config("qwen3")).eval()
        shapes = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=8)
        return bytes(text_generation.lower_decoder(model, shapes).to_executorch().buffer)

    first, second, int4, decoder = build(), build(), build_int4(), build_decoder()
    print(*(hashlib.sha256(pte).hexdigest() for pte in (first, second, int4, decoder)))
    """
)


def start_build(seed: str, directory: Path) -> subprocess.Popen:
    """The builds above in a process of their own, with its own hash seed and working directory."""
    tests = Path(__file__).resolve().parent
    code = BUILD.format(paths=[str(tests), str(tests.parent / "examples")])
    env = {**os.environ, "PYTHONHASHSEED": seed}
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=directory
    )


def hashes(process: subprocess.Popen) -> list[str]:
    stdout, stderr = process.communicate(timeout=900)  # on a timeout, the fixture kills what still runs
    assert process.returncode == 0, stderr[-3000:]
    return stdout.splitlines()[-1].split()


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> tuple[list[str], list[str]]:
    """Hashes of (a build, the same build again, an int4 build, a GQA decoder), from two processes in two directories.

    The two processes run side by side (each is mostly one core): a build
    pays coreai-opt's pattern building and the imports again in each.
    """
    processes = [start_build(seed, tmp_path_factory.mktemp(name)) for seed, name in (("1", "first"), ("2", "second"))]
    try:
        return hashes(processes[0]), hashes(processes[1])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()


def test_two_builds_are_byte_identical_in_one_process_and_across_processes(builds):
    first, second = builds
    assert first[0] == first[1], "two builds in one process differ"
    assert first[:2] == second[:2], "builds in two processes differ"


def test_int4_builds_in_two_processes_are_byte_identical(builds):
    first, second = builds
    assert first[2] == second[2], "int4 builds in two processes differ"


def test_gqa_decoder_builds_in_two_processes_and_directories_are_byte_identical(builds):
    first, second = builds
    assert first[3] == second[3], "GQA decoder builds in two processes differ"


def test_asset_names_do_not_depend_on_the_build():
    """Call sites and composite graphs are named after submodule paths and call-site indices."""
    from helpers import TwoNorms, asset_ir, externalize, lower, seeded, to_pte

    model = seeded(TwoNorms())
    ep, records = externalize(model, [torch.randn(2, 4, 16)])
    ir = asset_ir(to_pte(lower(ep, records)).delegates[0])
    assert "@n1.rmsnorm_impl_0(" in ir
    assert 'coreai.name = "call_n2_rmsnorm_impl_0"' in ir
    for record in records:
        assert record.op_name not in ir and record.name not in ir


class Buffers(torch.nn.Module):
    """Weight blobs of several dtypes, each large enough to be a blob, none a splat."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(512, dtype=torch.int32).reshape(2, 256) * 3)
        self.register_buffer("mask", (torch.arange(300) % 3) == 0)
        self.register_buffer("small_ints", torch.arange(300, dtype=torch.int8))
        self.register_buffer("halves", torch.linspace(-2, 2, 300, dtype=torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = self.table.float().sum() + self.mask.float().sum() + self.small_ints.float().sum()
        return x * total + self.halves.float().mean()


def test_weight_blobs_of_every_plain_dtype_keep_their_values():
    assert_lowers_and_matches(Buffers().eval(), torch.randn(2, 3), specs=[])


def test_a_decoder_traced_without_stack_traces_lowers_to_the_same_pte():
    """Stack traces are recorded only where something reads them: the default asset (``debug_info="none"``) has no
    locations, so a GQA decoder traced without them (its repeated heads rewritten by the backend's pass, which
    copies a node's stack trace only where there is one) is byte for byte the decoder traced with them."""
    from transformers import AutoModelForCausalLM

    from coreai_partitioner import text_generation
    from coreai_partitioner.lowering.lower import reads_stack_traces
    from coreai_partitioner.lowering.methods import lower_methods
    from coreai_partitioner.lowering.whole_program import decomposition_table
    from coreai_partitioner.text_decoder.shapes import runner_metadata
    from coreai_partitioner.text_generation.export import export_decoder

    assert not reads_stack_traces({}) and not reads_stack_traces({"debug_info": "op_ids"})
    assert reads_stack_traces({"debug_info": "full"}) and reads_stack_traces({}, generate_etrecord=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(text_generation.tiny_config("qwen3")).eval()
    shapes = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=8)
    ptes = {}
    for recorded in (True, False):
        program, records = export_decoder(model, shapes, decompositions=decomposition_table(), stack_traces=recorded)
        # (torch's runtime-assert pass gives the sizes it reads a stack trace of its own)
        traced = [n for n in program.graph.nodes if n.op == "call_function" and n.target != torch.ops.aten.sym_size.int]
        assert all(bool(node.meta.get("stack_trace")) == recorded for node in traced)
        edge = lower_methods([("forward", (program, records))], device=False, constant_methods=runner_metadata(model, shapes))
        ptes[recorded] = bytes(edge.to_executorch().buffer)
    assert ptes[True] == ptes[False]
    assert bytes(text_generation.lower_decoder(model, shapes).to_executorch().buffer) == ptes[False]
    assert torch.fx.config.do_not_emit_stack_traces is False  # restored


class ShortConvolution(torch.nn.Module):
    """A depthwise conv1d, as LFM2's and Qwen3.5's short convolutions: coreai-core folds its weight into a new blob
    of Core AI's conv2d shape, and a LayerNorm, which coreai-torch converts as a graph coreai-core builds per call."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(96, 96, 4, groups=96, padding=3)
        self.norm = torch.nn.LayerNorm(11)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


def test_folded_blobs_and_per_call_graphs_are_named_from_the_program_and_keep_their_values():
    import re

    from helpers import asset_ir, externalize, lower, to_pte

    torch.manual_seed(0)
    model, x = ShortConvolution().eval(), torch.randn(1, 96, 8)
    assert_lowers_and_matches(model, x, specs=[])
    ep, records = externalize(model, [x], [])
    ir = asset_ir(to_pte(lower(ep, records)).delegates[0])
    assert "dense_resource<constant_0> : tensor<96x1x1x4xf32>" in ir and "resource_" not in ir
    assert re.findall(r"coreai\.invoke @(layer_norm_[a-z]{8})\(", ir) == ["layer_norm_aaaaaaaa"]
