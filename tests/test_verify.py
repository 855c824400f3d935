"""coreai_partitioner.verify, .testing and the CLI, on the Core AI runtime."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from helpers import TwoNorms, externalize, lower, seeded, two_norms
from helpers import SplitBySort
from tiny_transformer import TinyTransformer

from coreai_partitioner import verify
from coreai_partitioner.verify import execution
from coreai_partitioner.cli import main as cli
from coreai_partitioner.verify.testing import assert_lowers_and_matches
from coreai_torch.composite_ops import RMSNorm, SDPA, GatedDeltaUpdate, GatherMM, RoPE

pytestmark = pytest.mark.slow



def split_program():
    model = seeded(SplitBySort())
    x = torch.randn(2, 4, 16)
    ep, records = externalize(model, [x])
    return model, x, lower(ep, records)


def test_partially_delegated_program_runs_end_to_end_and_matches_eager():
    model, x, lowered = split_program()
    assert len(verify.run(lowered, x)) == 1

    verify.check(lowered, model, x).raise_for_mismatch()
    verify.check(lowered.to_executorch(), model, x).raise_for_mismatch()


def test_pte_with_an_op_executorch_has_no_kernel_for_gets_a_clear_error(tmp_path):
    _, x, lowered = split_program()  # torch.sort stays outside the delegates; the portable kernels lack it
    path = tmp_path / "split.pte"
    path.write_bytes(lowered.to_executorch().buffer)
    torch.save((x,), tmp_path / "inputs.pt")

    with pytest.raises(verify.UnsupportedProgram, match="no kernel in this ExecuTorch build"):
        verify.run(path, x)
    assert cli.main(["verify", str(path), "--inputs", str(tmp_path / "inputs.pt")]) == cli.EXIT_UNSUPPORTED


@pytest.fixture(scope="module")
def two_norms_pte(tmp_path_factory):
    directory = tmp_path_factory.mktemp("two_norms")
    model, x, ep, records = two_norms()
    path = directory / "two_norms.pte"
    path.write_bytes(lower(ep, records).to_executorch().buffer)
    torch.save((x,), directory / "inputs.pt")
    torch.save(model(x).detach(), directory / "outputs.pt")
    return model, x, path


def test_a_changed_weight_is_caught_by_check_and_by_the_cli(two_norms_pte, tmp_path, capsys):
    model, x, path = two_norms_pte
    assert verify.check(path, model, x).ok

    with torch.no_grad():
        model.lin.weight[0, 0] += 0.5
    try:
        report = verify.check(path, model, x)
        torch.save(model(x).detach(), tmp_path / "changed.pt")
    finally:
        with torch.no_grad():
            model.lin.weight[0, 0] -= 0.5

    assert not report.ok
    assert "MISMATCH" in str(report)
    with pytest.raises(AssertionError, match="does not match its reference"):
        report.raise_for_mismatch()
    code = cli.main(
        ["verify", str(path), "--inputs", str(path.parent / "inputs.pt"), "--reference", str(tmp_path / "changed.pt")]
    )
    assert code == cli.EXIT_MISMATCH
    assert "NOT OK" in capsys.readouterr().out


def test_fully_delegated_pte_round_trips_through_both_cli_commands(two_norms_pte):
    _, _, path = two_norms_pte
    directory = path.parent
    verify_run = subprocess.run(
        [sys.executable, "-m", "coreai_partitioner", "verify", str(path),
         "--inputs", str(directory / "inputs.pt"), "--reference", str(directory / "outputs.pt")],
        capture_output=True, text=True, timeout=300,
    )
    assert verify_run.returncode == 0, verify_run.stdout + verify_run.stderr
    assert verify_run.stdout.rstrip().endswith("ok")

    inspect_run = subprocess.run(
        [sys.executable, "-m", "coreai_partitioner", "inspect", str(path)],
        capture_output=True, text=True, timeout=300,
    )
    assert inspect_run.returncode == 0, inspect_run.stderr
    out = inspect_run.stdout
    method = next(line.split() for line in out.splitlines() if line.startswith("forward"))
    assert method == ["forward", "1", "1"]  # one instruction: the delegate call
    delegate = next(line.split() for line in out.splitlines() if "CoreAICompositeBackend" in line)
    assert delegate[:5] == ["forward", "0", "CoreAICompositeBackend", "inline", delegate[4]]
    assert delegate[5:] == ["2", "rms_norm", "x2"]  # coreai.invoke, composites
    assert "axes = -1 : si64, eps = 9.99999974E-6 : f32, version = 1 : si64" in out


def test_a_compiled_asset_is_not_compiled_again(two_norms_pte):
    model, x, path = two_norms_pte
    verify.run(path, x)
    compiled = verify.compiled_assets()
    verify.run(path.read_bytes(), x)
    verify.run(path, x)
    assert verify.compiled_assets() == compiled


def test_a_pte_path_is_hashed_once_and_again_only_when_the_file_changes(tmp_path, monkeypatch):
    # A decode loop runs a path once per token: it must not read and hash the whole .pte each time.
    path = tmp_path / "model.pte"
    programs = []
    for _ in range(2):
        model, x, ep, records = two_norms()
        programs.append((model, x, lower(ep, records).to_executorch().buffer))
    hashes = []
    sha256 = execution.hashlib.sha256
    monkeypatch.setattr(execution.hashlib, "sha256", lambda *data: hashes.append(1) or sha256(*data))
    for model, x, data in programs:  # the second is written over the first, at the same path
        path.write_bytes(data)
        before = len(hashes)
        torch.testing.assert_close(verify.run(path, x)[0], model(x).detach(), rtol=1e-4, atol=1e-5)
        assert len(hashes) > before  # a new file: hashed (and loaded)
        loaded = len(hashes)
        for _ in range(3):
            torch.testing.assert_close(verify.run(path, x)[0], model(x).detach(), rtol=1e-4, atol=1e-5)
        assert len(hashes) == loaded  # the same file: not hashed again
    assert not torch.allclose(programs[0][0](x), programs[1][0](x))


def test_fp16_model_matches_within_fp16_tolerance():
    model = TinyTransformer(layers=1, dim=32, heads=4).half().eval()
    tokens = torch.randint(0, 128, (1, 8), dtype=torch.int32)
    report = assert_lowers_and_matches(model, tokens)
    assert report.outputs[0].dtype == torch.float16
    assert (report.outputs[0].rtol, report.outputs[0].atol) == verify.default_tolerances(torch.float16)


def test_bf16_model_matches_within_bf16_tolerance():
    model = TinyTransformer(layers=1, dim=32, heads=4).to(torch.bfloat16).eval()
    tokens = torch.randint(0, 128, (1, 8), dtype=torch.int32)
    report = assert_lowers_and_matches(model, tokens)
    assert report.outputs[0].dtype == torch.bfloat16


class RunningCache(torch.nn.Module):
    """Writes each step's normalized input into a cache buffer, reads the whole cache."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm(8)
        self.register_buffer("cache", torch.zeros(1, 6, 8))

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(1, position, self.norm(x))
        return self.cache.sum(1) * 2.0


def test_stateful_delegate_carries_state_over_four_calls_like_eager():
    model = seeded(RunningCache())
    steps = [(torch.randn(1, 1, 8), torch.tensor([i])) for i in range(4)]
    ep, records = externalize(model, steps[0])
    lowered = lower(ep, records)

    eager = seeded(RunningCache())
    eager.load_state_dict(model.state_dict())
    outputs = []
    for x, position in steps:
        (out,) = verify.run(lowered, x, position)
        outputs.append(out)
        torch.testing.assert_close(out, eager(x, position).detach(), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(outputs[0], outputs[3])  # the cache really filled up

    verify.reset_state(lowered)
    (again,) = verify.run(lowered, *steps[0])
    torch.testing.assert_close(again, outputs[0])


class Rope(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rope = RoPE(base=10000.0)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.rope(x, position_ids=positions)


class Attention(torch.nn.Module):
    def __init__(self, **options) -> None:
        super().__init__()
        self.sdpa = SDPA(**options)

    def forward(self, q, k, v, mask=None):
        return self.sdpa(q, k, v, attn_mask=mask)


class Gather(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gather_mm = GatherMM()

    def forward(self, lhs, rhs, rhs_indices):
        return self.gather_mm(lhs, rhs, rhs_indices=rhs_indices)


class Delta(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.update = GatedDeltaUpdate()

    def forward(self, q, k, v, g, beta, state):
        return self.update(q, k, v, g, beta, state)


def qkv(heads: int = 4, kv_heads: int = 4, seq: int = 8, dim: int = 16):
    return torch.randn(1, heads, seq, dim), torch.randn(1, kv_heads, seq, dim), torch.randn(1, kv_heads, seq, dim)


COMPOSITES = {
    "rms_norm": lambda: (seeded(TwoNorms()), (torch.randn(2, 4, 16),)),
    "rope": lambda: (Rope(), (torch.randn(1, 4, 8, 16), torch.arange(8, dtype=torch.float32)[None])),
    "sdpa_causal": lambda: (Attention(is_causal=True), qkv()),
    "sdpa_attn_mask": lambda: (Attention(), (*qkv(), torch.rand(8, 8) > 0.3)),
    "sdpa_gqa": lambda: (Attention(is_causal=True), qkv(heads=8, kv_heads=2)),
    "gather_mm": lambda: (Gather(), (torch.randn(4, 8), torch.randn(3, 8, 5), torch.tensor([0, 2, 1, 2], dtype=torch.int32))),
    "gated_delta_update": lambda: (
        Delta(),
        (*qkv(heads=2, kv_heads=2, seq=4, dim=8), -torch.rand(1, 2, 4), torch.rand(1, 2, 4), torch.randn(1, 2, 8, 8)),
    ),
}


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_every_composite_is_externalized_and_verified_numerically(name):
    model, sample = COMPOSITES[name]()
    report = assert_lowers_and_matches(model.eval(), sample)
    assert report.ok and report.outputs


def test_report_table_names_every_output():
    report = verify.compare([torch.ones(2), torch.zeros(3)], [torch.ones(2), torch.ones(3)])
    text = str(report)
    assert not report.ok
    assert text.splitlines()[2].split()[:3] == ["0", "(2,)", "float32"]
    assert "MISMATCH (3 element(s) out of tolerance)" in text
