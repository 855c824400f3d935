"""ExecuTorch's own runtime runs our .pte files, Core AI delegates on the host backend, compared with eager."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading

import pytest
import torch
from executorch.backends.apple.coreai import coreai_sidecar_dir
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime
from helpers import SplitByCdist, TwoNorms, externalize, lower, run_pte, seeded, two_norms

from coreai_partitioner import (
    CoreAIPartitioner,
    export_with_composites,
    get_default_compile_config,
    get_default_passes,
    load_runtime_backend,
    verify,
)
from coreai_partitioner.backends.apple_coreai.runtime import host as host_runtime
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte
from coreai_torch.composite_ops import GatedDeltaUpdate, RMSNorm

pytestmark = pytest.mark.slow

torch.manual_seed(0)


class StepCache(torch.nn.Module):
    """One decode step: writes the normalized token into a cache buffer at ``position``, reads the whole cache."""

    def __init__(self, initial: torch.Tensor | None = None) -> None:
        super().__init__()
        self.norm = RMSNorm(8)
        self.register_buffer("cache", torch.zeros(1, 8, 8) if initial is None else initial.clone())

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(1, position, self.norm(x))
        return self.cache.sum(1) * 2.0


def steps(count: int = 8):
    return [(torch.randn(1, 1, 8), torch.tensor([i])) for i in range(count)]


def stateful_pte(initial: torch.Tensor | None = None, **options) -> tuple[StepCache, bytes]:
    model = seeded(StepCache(initial))
    ep, records = externalize(model, steps(1)[0])
    pte = lower(ep, records, take_over_mutable_buffer=True, **options).to_executorch().buffer
    eager = seeded(StepCache(initial))
    eager.load_state_dict(model.state_dict())
    return eager, pte


def forward(program, *inputs, method: str = "forward"):
    return program.load_method(method).execute(list(inputs))


def replace_once(data: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new) and data.count(old) == 1, (old, new)
    return data.replace(old, new)


@pytest.fixture(scope="module")
def two_norms_pte():
    model, x, ep, records = two_norms()
    return model, x, lower(ep, records).to_executorch().buffer


# ---------------------------------------------------------------- registration and programs


def test_backend_registers_both_backend_ids_once():
    assert load_runtime_backend() == ["CoreAICompositeBackend", "CoreAIBackend"]
    assert load_runtime_backend() == ["CoreAICompositeBackend", "CoreAIBackend"]
    names = Runtime.get().backend_registry.registered_backend_names
    assert names.count("CoreAICompositeBackend") == 1 and names.count("CoreAIBackend") == 1


def test_plain_executorch_runtime_runs_an_inline_pte_like_eager(two_norms_pte):
    model, x, pte = two_norms_pte
    (out,) = run_pte(pte, [x])
    torch.testing.assert_close(out, model(x).detach(), rtol=1e-4, atol=1e-5)


def test_partially_delegated_method_with_two_delegates_runs_the_rest_on_portable_kernels():
    model = seeded(SplitByCdist())
    x = torch.randn(2, 4, 16)
    ep, records = externalize(model, [x])
    pte = lower(ep, records).to_executorch().buffer
    contents = read_pte(pte)
    assert len(contents.coreai_delegates("forward")) == 2
    assert len(contents.plans["forward"].instructions) > 2  # cdist runs outside the delegates

    (out,) = forward(host_runtime.load_program(pte), x)
    torch.testing.assert_close(out, model(x).detach(), rtol=1e-4, atol=1e-5)


def test_two_method_pte_runs_each_method_like_its_eager_model():
    norms = seeded(TwoNorms())
    split = seeded(SplitByCdist())
    x = torch.randn(2, 4, 16)
    norms_ep, norms_records = externalize(norms, [x])
    split_ep, split_records = externalize(split, [x])
    lowered = to_edge_transform_and_lower(
        {"norms": norms_ep, "split": split_ep},
        partitioner={
            "norms": [CoreAIPartitioner(externalized_modules=norms_records)],
            "split": [CoreAIPartitioner(externalized_modules=split_records)],
        },
        compile_config=get_default_compile_config(),
        transform_passes=get_default_passes(),
    )
    program = host_runtime.load_program(lowered.to_executorch().buffer)
    assert program.method_names == {"norms", "split"}
    torch.testing.assert_close(forward(program, x, method="norms")[0], norms(x).detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(forward(program, x, method="split")[0], split(x).detach(), rtol=1e-4, atol=1e-5)


def test_stateful_decode_loop_of_eight_steps_matches_eager_and_two_loads_keep_their_own_state():
    eager, pte = stateful_pte()
    first = host_runtime.load_program(pte)
    second = host_runtime.load_program(pte)
    inputs = steps(8)
    outputs = []
    for x, position in inputs:
        (out,) = forward(first, x, position)
        outputs.append(out)
        torch.testing.assert_close(out, eager(x, position).detach(), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(outputs[0], outputs[7])  # the cache really filled up

    (fresh,) = forward(second, *inputs[0])  # the second load starts from its own empty cache
    torch.testing.assert_close(fresh, outputs[0])


class DeltaRules(torch.nn.Module):
    """Three gated delta rules in a row, each carrying its own recurrent state from call to call."""

    def __init__(self, count: int = 3) -> None:
        super().__init__()
        self.updates = torch.nn.ModuleList(GatedDeltaUpdate() for _ in range(count))
        for i in range(count):
            self.register_buffer(f"state{i}", torch.zeros(1, 2, 8, 8))

    def forward(self, q, k, v, g, beta):
        for i, update in enumerate(self.updates):
            out, state = update(q, k, v, g, beta, getattr(self, f"state{i}"))
            getattr(self, f"state{i}").copy_(state)
            q = out.transpose(1, 2)
        return q


def test_three_composites_each_reading_a_state_convert_and_carry_it_from_call_to_call():
    # coreai-core 1.0.0b3 refuses an odd number (3+) of such calls fed the state itself:
    # passes.state_operands_as_values feeds them a value.
    def call():
        x = torch.randn(1, 2, 4, 8)
        return x, torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), -torch.rand(1, 2, 4), torch.rand(1, 2, 4)

    model = DeltaRules().eval()
    ep, records = externalize(model, call())
    program = host_runtime.load_program(lower(ep, records, take_over_mutable_buffer=True).to_executorch().buffer)
    eager = DeltaRules().eval()
    for inputs in (call(), call()):
        (out,) = forward(program, *inputs)
        torch.testing.assert_close(out, eager(*inputs), rtol=1e-4, atol=1e-5)
    assert eager.state2.abs().sum() > 0


def test_each_call_reads_its_own_inputs_and_a_dynamic_dimension_resizes_between_calls():
    model = seeded(TwoNorms())
    tokens = torch.export.Dim("tokens", min=2, max=8)
    ep, records = export_with_composites(model, [torch.randn(2, 4, 16)], dynamic_shapes=({1: tokens},))
    program = host_runtime.load_program(lower(ep, records).to_executorch().buffer)
    method = program.load_method("forward")
    for x in (torch.randn(2, 4, 16), torch.randn(2, 4, 16), torch.randn(2, 7, 16), torch.randn(2, 3, 16)):
        (out,) = method.execute([x])
        torch.testing.assert_close(out, model(x).detach(), rtol=1e-4, atol=1e-5)


def test_a_pte_runs_from_worker_threads_and_from_inside_a_running_event_loop(two_norms_pte):
    model, x, pte = two_norms_pte
    program = host_runtime.load_program(pte)
    method = program.load_method("forward")

    async def inside_a_loop():  # a notebook's or an async test's thread: calls go to the background loop
        return method.execute([x])[0]

    def in_a_worker_thread(value: torch.Tensor) -> None:  # each thread runs its calls on its own loop
        own = host_runtime.load_program(pte)
        results.append((value, own.load_method("forward").execute([value])[0], method.execute([value])[0]))

    results = [(x, asyncio.run(inside_a_loop()), method.execute([x])[0])]
    for value in (2 * x, x - 1):
        thread = threading.Thread(target=in_a_worker_thread, args=(value,))
        thread.start()
        thread.join()
    assert len(results) == 3
    for value, *outputs in results:
        for output in outputs:
            torch.testing.assert_close(output, model(value).detach(), rtol=1e-4, atol=1e-5)


def test_a_second_thread_entering_a_delegate_while_one_runs_is_refused_and_the_process_exits_cleanly(
    two_norms_pte, tmp_path
):
    _, _, pte = two_norms_pte
    path = tmp_path / "model.pte"
    path.write_bytes(pte)
    # The second thread enters while the first is inside its delegate and would
    # leave ExecuTorch after it (the order that corrupted std::cout).
    script = (
        "import sys, threading, torch\n"
        "from coreai_partitioner.backends.apple_coreai.runtime import host as host_runtime\n"
        "from coreai_partitioner.backends.apple_coreai.runtime.loaded_asset import LoadedAsset\n"
        "x = torch.randn(2, 4, 16)\n"
        "first, second = host_runtime.load_program(sys.argv[1]), host_runtime.load_program(sys.argv[1])\n"
        "method, other = first.load_method('forward'), second.load_method('forward')\n"
        "entered, first_done, refused = threading.Event(), threading.Event(), []\n"
        "def other_thread():\n"
        "    try:\n"
        "        other.execute([x])\n"
        "    except RuntimeError:\n"
        "        refused.append(host_runtime.last_error())\n"
        "        entered.set()\n"
        "class StartsAnotherThread(LoadedAsset):\n"
        "    def __call__(self, *args):\n"
        "        threading.Thread(target=other_thread).start()\n"
        "        entered.wait()\n"
        "        return super().__call__(*args)\n"
        "class WaitsForTheFirst(LoadedAsset):\n"
        "    def __call__(self, *args):\n"
        "        entered.set()\n"
        "        first_done.wait()\n"
        "        return super().__call__(*args)\n"
        "a, b = sorted(host_runtime._delegates)\n"
        "import copy\n"  # two programs of one .pte share a compiled asset: each delegate gets its own view to patch
        "for d in (a, b): host_runtime._delegates[d].asset = copy.copy(host_runtime._delegates[d].asset)\n"
        "host_runtime._delegates[a].asset.__class__ = StartsAnotherThread\n"
        "host_runtime._delegates[b].asset.__class__ = WaitsForTheFirst\n"
        "(out,) = method.execute([x])\n"
        "first_done.set()\n"
        "assert out.shape == x.shape\n"
        "print(refused[0])\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "another thread is inside a Core AI delegate" in run.stdout and "one thread at a time" in run.stdout


def test_a_non_zero_initial_buffer_starts_from_its_value_in_a_pte():
    initial = torch.randn(1, 8, 8)
    eager, pte = stateful_pte(initial)
    manifest = read_pte(pte).coreai_delegates()[0].manifest
    assert list(manifest["initial_state"].values())[0]["shape"] == [1, 8, 8]

    program = host_runtime.load_program(pte)
    for x, position in steps(3):
        (out,) = forward(program, x, position)
        torch.testing.assert_close(out, eager(x, position).detach(), rtol=1e-4, atol=1e-5)


def test_a_zero_initial_buffer_ships_no_initial_value():
    _, pte = stateful_pte()
    assert "initial_state" not in read_pte(pte).coreai_delegates()[0].manifest


def test_sidecar_pte_runs_from_the_directory_beside_it(tmp_path):
    model, x, ep, records = two_norms()
    with coreai_sidecar_dir(str(tmp_path)):
        pte = lower(ep, records, uses_sidecar=True).to_executorch().buffer
    path = tmp_path / "model.pte"
    path.write_bytes(pte)

    (out,) = forward(host_runtime.load_program(path), x)
    torch.testing.assert_close(out, model(x).detach(), rtol=1e-4, atol=1e-5)
    verify.check(path, model, x).raise_for_mismatch()


def test_sidecar_stateful_pte_ships_its_initial_value_in_the_sidecar(tmp_path):
    initial = torch.randn(1, 8, 8)
    with coreai_sidecar_dir(str(tmp_path)):
        eager, pte = stateful_pte(initial, uses_sidecar=True)
    program = host_runtime.load_program(pte, sidecar_dir=tmp_path)
    x, position = steps(1)[0]
    torch.testing.assert_close(forward(program, x, position)[0], eager(x, position).detach(), rtol=1e-4, atol=1e-5)


def test_destroying_a_program_releases_its_delegates(two_norms_pte):
    _, x, pte = two_norms_pte
    gc.collect()
    before = host_runtime.live_delegates()
    program = host_runtime.load_program(pte)
    assert host_runtime.live_delegates() == before + 1
    del program
    gc.collect()
    assert host_runtime.live_delegates() == before


def test_verify_runs_a_partially_delegated_pte_and_reset_state_starts_over(tmp_path):
    eager, pte = stateful_pte()
    inputs = steps(3)
    first = [verify.run(pte, *step)[0] for step in inputs]
    verify.reset_state(pte)
    assert torch.equal(verify.run(pte, *inputs[0])[0], first[0])
    assert not torch.equal(first[0], first[2])


def test_the_cli_verifies_a_split_pte_it_could_not_run_before(tmp_path):
    model = seeded(SplitByCdist())
    x = torch.randn(2, 4, 16)
    ep, records = externalize(model, [x])
    path = tmp_path / "split.pte"
    path.write_bytes(lower(ep, records).to_executorch().buffer)
    torch.save((x,), tmp_path / "inputs.pt")
    torch.save(model(x).detach(), tmp_path / "outputs.pt")
    run = subprocess.run(
        [sys.executable, "-m", "coreai_partitioner", "verify", str(path),
         "--inputs", str(tmp_path / "inputs.pt"), "--reference", str(tmp_path / "outputs.pt")],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.rstrip().endswith("ok")


# ---------------------------------------------------------------- bad input


def run_error(program, *inputs) -> str:
    host_runtime.clear_last_error()
    with pytest.raises(RuntimeError):
        forward(program, *inputs)
    return host_runtime.last_error()


def load_error(pte, **options) -> str:
    with pytest.raises(RuntimeError) as error:
        host_runtime.load_program(pte, **options)
    return str(error.value)


def test_wrong_input_count_shape_and_dtype_are_errors(two_norms_pte):
    _, x, pte = two_norms_pte
    program = host_runtime.load_program(pte)
    with pytest.raises(RuntimeError):
        forward(program, x, x)
    with pytest.raises(RuntimeError):
        forward(program)
    with pytest.raises(RuntimeError):
        forward(program, torch.randn(2, 4, 8))
    with pytest.raises(RuntimeError):
        forward(program, x.to(torch.int32))
    (out,) = forward(program, x)  # the method still runs after refusing bad inputs
    assert out.shape == x.shape


def test_a_truncated_or_corrupt_manifest_is_refused_with_the_delegate_named(two_norms_pte):
    _, _, pte = two_norms_pte
    payload = read_pte(pte).coreai_delegates()[0].payload
    truncated = replace_once(pte, payload, payload[:-1] + b" ")
    assert "manifest is not valid JSON" in load_error(truncated)
    garbage = replace_once(pte, payload, b"\xff" * len(payload))
    assert "CoreAICompositeBackend delegate in method 'forward'" in load_error(garbage)


def test_an_asset_path_other_than_its_hashs_bundle_is_refused(two_norms_pte):
    _, _, pte = two_norms_pte
    manifest = read_pte(pte).coreai_delegates()[0].manifest
    digest = manifest["hash"]
    dotdot = replace_once(pte, f'"{digest}/model.aimodel"'.encode(), f'"{digest}/../../../../x"'.encode())
    assert "is not '<hash>/model.aimodel'" in load_error(dotdot)
    absolute = replace_once(pte, f'"path": "{digest}'.encode(), f'"path": "/{digest[1:]}'.encode())
    assert "is not '<hash>/model.aimodel'" in load_error(absolute)


def test_a_file_the_named_data_does_not_hold_is_refused(two_norms_pte):
    _, _, pte = two_norms_pte
    renamed = replace_once(pte, b'"model.aimodel/main.mlirb"', b'"model.aimodel/main.mlirX"')
    assert "named data holds no" in load_error(renamed)


def test_a_corrupt_inline_asset_is_refused_before_the_core_ai_runtime_sees_it(two_norms_pte):
    _, _, pte = two_norms_pte
    program_bytes = bytes(read_pte(pte).coreai_delegates()[0].files["model.aimodel/main.mlirb"])
    middle = len(program_bytes) // 2
    corrupt = replace_once(pte, program_bytes, program_bytes[:middle] + b"\xff" * 16 + program_bytes[middle + 16 :])
    assert "do not match the bundle digest of its manifest" in load_error(corrupt)


def test_a_truncated_pte_is_an_error(two_norms_pte):
    _, _, pte = two_norms_pte
    with pytest.raises(RuntimeError):
        host_runtime.load_program(pte[: len(pte) // 2])


def test_initial_state_sizes_out_of_bounds_are_refused():
    _, pte = stateful_pte(torch.randn(1, 8, 8))
    huge = replace_once(pte, b'"shape": [1, 8, 8]', b'"shape": [1e99, 8]')
    assert "out of bounds" in load_error(huge)
    mismatched = replace_once(pte, b'"shape": [1, 8, 8]', b'"shape": [2, 8, 8]')
    assert "disagrees" in load_error(mismatched)


def test_missing_or_deleted_sidecar_and_a_symlink_out_are_refused(tmp_path):
    import shutil

    _, _, ep, records = two_norms()
    build = tmp_path / "build"
    with coreai_sidecar_dir(str(build)):
        pte = lower(ep, records, uses_sidecar=True).to_executorch().buffer
    digest = read_pte(pte).coreai_delegates()[0].manifest["hash"]

    assert "does not exist" in load_error(pte, sidecar_dir=tmp_path / "nowhere")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert "not found" in load_error(pte, sidecar_dir=elsewhere)

    (elsewhere / digest).symlink_to(build / digest)  # the asset is there, but outside the sidecar directory
    assert "outside the sidecar directory" in load_error(pte, sidecar_dir=elsewhere)

    program = build / digest / "model.aimodel" / "main.mlirb"
    original = program.read_bytes()
    program.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))  # same size, one bit changed
    assert "do not match the bundle digest of its manifest" in load_error(pte, sidecar_dir=build)
    program.write_bytes(b"\0" * 64)
    assert "its manifest lists" in load_error(pte, sidecar_dir=build)
    (build / digest / "model.aimodel" / "extra.bin").write_bytes(original)
    program.write_bytes(original)
    assert "its manifest lists" in load_error(pte, sidecar_dir=build)

    shutil.rmtree(build / digest)
    assert "not found" in load_error(pte, sidecar_dir=build)


def test_a_sidecar_pte_without_a_sidecar_directory_says_where_to_look(two_norms_pte, monkeypatch, tmp_path):
    _, _, ep, records = two_norms()
    with coreai_sidecar_dir(str(tmp_path)):
        pte = lower(ep, records, uses_sidecar=True).to_executorch().buffer
    monkeypatch.delenv("COREAI_SIDECAR_DIR", raising=False)
    load_runtime_backend()
    program = Runtime.get().load_program(pte)
    host_runtime.clear_last_error()
    with pytest.raises(RuntimeError):
        program.load_method("forward")
    assert "no sidecar directory is set" in host_runtime.last_error()


def test_an_aot_compiled_manifest_is_not_supported_here(two_norms_pte):
    _, _, pte = two_norms_pte
    payload = read_pte(pte).coreai_delegates()[0].payload
    text = b'{"packaging": "aot_compiled_inline", "hash": "ab"}'
    aot = replace_once(pte, payload, text + b" " * (len(payload) - len(text)))
    assert "run only on Apple devices" in load_error(aot)


def test_loading_without_registering_the_python_side_fails_cleanly(two_norms_pte, tmp_path):
    _, _, pte = two_norms_pte
    path = tmp_path / "model.pte"
    path.write_bytes(pte)
    script = (
        "import ctypes, os, sys\n"
        "from coreai_partitioner.backends.apple_coreai.runtime import host as host_runtime\n"
        "from executorch.runtime import Runtime\n"
        "Runtime.get()\n"
        "ctypes.CDLL(str(host_runtime.library_path()), os.RTLD_GLOBAL)\n"
        "program = Runtime.get().load_program(sys.argv[1])\n"
        "try:\n"
        "    program.load_method('forward')\n"
        "except RuntimeError:\n"
        "    print('refused')\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ})
    assert run.returncode == 0, run.stderr
    assert "refused" in run.stdout
    assert "load_runtime_backend()" in run.stderr
