"""Two fresh processes export the same models and write the same bytes: the sha256 of every file is equal.

Each side is one process (:mod:`same_bytes`) exporting a list of builds one after another and printing each
written file's sha256 (``.pte``, ``.ptd``, an adapter's ``.pte``, the tokenizer and configs a task writes
beside them).  The second side runs in its own directory, with another ``PYTHONHASHSEED`` and its list in
reverse order, so a name drawn from a count kept across builds in one process differs too, as would one from
a random draw, ``id()``, a per-process hash seed or the set order that seed decides.

CI runs :data:`SAMPLE`, one build of each way a name reached the ``.pte`` from the process (a short
convolution's folded weight, coreai-core's per-call composite graphs); ``pytest -m benchmark
tests/test_same_bytes.py`` runs :data:`EVERY_BUILD`: every decoder family's tiny config in the host, device and
int4 forms, the other decoder forms and files (a data file, an adapter's ``.pte``), every task's tiny configs,
``lower()`` of a tiny BERT and of three torchvision models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm_helpers import ROWS, ci_sample
from same_bytes import MARK

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent

#: What each task's ``--config`` offers (``export --task TASK --help``).
TASK_CONFIGS = {
    "automatic-speech-recognition": ["whisper"],
    "feature-extraction": ["sentence-bert", "sentence-roberta", "sentence-distilbert"],
    "fill-mask": ["bert", "roberta", "distilbert"],
    "image-classification": ["vit", "deit"],
    "image-text-to-text": ["gemma3", "idefics3", "llava", "smolvlm"],
    "text2text-generation": ["t5", "flan-t5"],
    "text-to-image": ["stable-diffusion", "stable-diffusion-3"],
    "text-to-speech": ["vits", "kokoro"],
}

#: CI's: the two ways a build differed between processes (sub-byte blobs and an adapter's files: the sweep's).
SAMPLE = [
    "text-generation lfm2 device",  # a short convolution: the weight coreai-core folds is a blob of its own
    "lower bert",  # coreai-core's per-call layer_norm and attention graphs
]
EVERY_BUILD = [
    *(
        f"text-generation {family} {form}"
        for family in ROWS
        for form in ("host", "device", "int4")
    ),
    "text-generation llama external-data",
    "text-generation llama adapter",
    "text-generation qwen3 graph-breaks",
    *(f"{task} {config}" for task, configs in TASK_CONFIGS.items() for config in configs),
    "lower bert",
    *(f"torchvision {name}" for name in ("mobilenet_v2 64", "resnet50 32", "vit_b_16 32")),
]
assert set(SAMPLE) <= set(EVERY_BUILD)
LISTS = {"sample": SAMPLE, "every build": EVERY_BUILD}


def start(lines: list[str], seed: str, directory: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent / "examples")])}
    return subprocess.Popen(
        [sys.executable, "-m", "same_bytes", str(directory / "out"), *lines],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=directory,
    )


def hashes(process: subprocess.Popen, timeout: float) -> dict[str, dict[str, str]]:
    stdout, stderr = process.communicate(timeout=timeout)
    assert process.returncode == 0, stderr[-4000:]
    builds = [json.loads(line[len(MARK) :]) for line in stdout.splitlines() if line.startswith(MARK)]
    return {build["build"]: build["files"] for build in builds}


@pytest.mark.parametrize("builds", ci_sample(list(LISTS), ["sample"]))
def test_two_fresh_processes_exporting_the_same_builds_write_files_of_the_same_sha256(builds, tmp_path):
    lines = LISTS[builds]
    for side in ("first", "second"):
        (tmp_path / side).mkdir()
    processes = [start(lines, "1", tmp_path / "first"), start(lines[::-1], "2", tmp_path / "second")]
    try:
        timeout = 900 if builds == "sample" else 6 * 3600
        first, second = (hashes(process, timeout) for process in processes)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert set(first) == set(second) == set(lines)
    assert all(any(name.endswith(".pte") for name in first[line]) for line in lines)
    differ = {line: sorted(n for n in first[line] if first[line][n] != second[line].get(n)) for line in lines}
    assert not {line: names for line, names in differ.items() if names}, "files that differ between two processes"
    assert first == second
