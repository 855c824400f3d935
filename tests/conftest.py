"""Every test starts from the same random state; upstream's Core AI suite runs beside ours; the heaviest files start first.

ExecuTorch's own Core AI tests (``tests/upstream/shim.py``) take minutes in a
process of their own, mostly on one core.  In one process (``-n 0``), when
the session includes ``test_upstream_conformance.py``, they start as soon as
collection ends, on the second core, and that test collects their result.
Under pytest-xdist (``-n 2``, pytest.ini) the test starts them itself and
waits, so its worker's core runs them; it is first in ``HEAVIEST_FIRST``.

xdist's ``loadfile`` hands whole files to the workers in collection order
(``--no-loadscope-reorder``), so the files that take longest go first and
the small ones fill in at the end.  Each worker computes on one torch thread.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

SHIM = Path(__file__).parent / "upstream" / "shim.py"

if "PYTEST_XDIST_WORKER" in os.environ:
    # A worker per core (pytest.ini's -n 2): torch's own thread pool beside the other worker's makes 4 threads on
    # 2 cores, each spinning in OpenMP while it waits, for many times one thread's CPU.  One thread each, and the
    # processes a test starts inherit it.
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"


@dataclass
class UpstreamRun:
    """The upstream suite running in its own process: its JSON results and its console log."""

    process: subprocess.Popen
    results: Path
    log: Path

    @classmethod
    def start(cls) -> UpstreamRun:
        directory = Path(tempfile.mkdtemp(prefix="upstream-coreai-"))
        results, log = directory / "upstream.json", directory / "upstream.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, str(SHIM), "--json", str(results)], stdout=out, stderr=subprocess.STDOUT
            )
        return cls(process, results, log)

    def wait(self, timeout: float) -> str:
        """Waits for the run to end; returns the tail of its log."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.log.read_text(errors="replace")[-6000:]


_upstream: list[UpstreamRun] = []

#: Test files by wall time in one run of the suite under ``-n 2``, longest first (``pytest --durations=0``);
#: files not named follow in their own order.
HEAVIEST_FIRST = (
    "test_upstream_conformance.py",  # 320 s, its worker waiting on upstream's process
    "test_real_model.py",  # 330 s: the installed command with two adapters, in a process it waits on
    "test_llm_device.py",  # 430 s
    "test_real_quantized.py",  # 370 s, in the benchmark tier
    "test_llm_families.py",  # 260 s
    "test_vision.py",  # 140 s in one process
    "test_speculative_real.py",  # the real SmolLM2 exported, ten prompts decoded three ways
    "test_speculative.py",  # three families through the runtime, every family eagerly
    "test_upstream_lookahead.py",  # 150 s: two lowerings, ExecuTorch's lookahead_decode over them
    "test_speech.py",  # 270 s in one process at a load of 3 here: Whisper base exported twice, four encoder calls
    "test_transformers_rc1.py",
    "test_text2text.py",  # 50 s in one process: five lowerings, one in transformers 5.0.0rc1's process
    "test_kokoro.py",  # 60 s: Kokoro's decoder keeps its 1024 channels at the tiny config
    "test_quantized_schemes.py",
    "test_quantize.py",
    "test_export_llm.py",
    "test_llm.py",
    "test_fidelity.py",
    "test_reproducible.py",
    "test_backend.py",
    "test_verify.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The ``benchmark`` tier (cases beyond CI's sample, llm_helpers.ci_sample) runs only when -m names it.
    if "benchmark" not in (config.option.markexpr or ""):
        beyond = [item for item in items if item.get_closest_marker("benchmark")]
        if beyond:
            config.hook.pytest_deselected(items=beyond)
            items[:] = [item for item in items if not item.get_closest_marker("benchmark")]
    rank = {name: position for position, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_collection_finish(session: pytest.Session) -> None:
    in_one_process = "PYTEST_XDIST_WORKER" not in os.environ
    if in_one_process and any(item.path.name == "test_upstream_conformance.py" for item in session.items):
        _upstream.append(UpstreamRun.start())


def pytest_sessionfinish(session: pytest.Session) -> None:
    for run in _upstream:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()
        shutil.rmtree(run.results.parent, ignore_errors=True)


@pytest.fixture
def upstream_run() -> UpstreamRun:
    if not _upstream:
        _upstream.append(UpstreamRun.start())
    return _upstream[0]


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


def run_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory every pytest-xdist worker of this run shares (their base temps' parent), or this process's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


@pytest.fixture(scope="session")
def real_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct, a real trained model, as a Hugging Face checkpoint folder (tests/real_checkpoint.py):
    written once a run, the first worker to need it writing it while the other waits."""
    from filelock import FileLock  # torch's and huggingface_hub's dependency
    from real_checkpoint import smollm2_checkpoint

    shared = run_directory(tmp_path_factory)
    with FileLock(shared / "real-checkpoint.lock"):
        return smollm2_checkpoint(shared / "real-checkpoint" / "smollm2-135m-instruct")


@pytest.fixture(scope="session")
def real_adapters(real_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two PEFT LoRA adapters over ``real_checkpoint``, each trained on a made-up fact (tests/real_adapters.py)."""
    from real_adapters import trained_adapters

    return trained_adapters(tmp_path_factory.mktemp("adapters"), real_checkpoint)
