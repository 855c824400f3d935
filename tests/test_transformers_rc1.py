"""The LLM path on transformers 5.0.0rc1 too: what optimum-executorch 1.1.0 pins, beside the 5.24.0 the venv has.

The two cannot share one environment (5.0.0rc1 wants tokenizers <= 0.23.0 and
huggingface-hub < 2; 5.24.0 tokenizers >= 0.23.1), so README's test command
installs 5.0.0rc1 and what differs with ``pip install --no-deps --target
.venv/transformers-rc1 -r tests/requirements-transformers-rc1.txt``, and
``tests/rc1/families.py`` runs with that folder first on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from llm_helpers import ROWS, ci_sample

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / ".venv" / "transformers-rc1"
#: Families whose transformers classes came after 5.0.0rc1.
NEWER = {"gemma4_text", "qwen3_5_text", "qwen3_5_moe_text"}


def rc1_environment() -> dict:
    if not (TARGET / "transformers").is_dir():
        pytest.fail(
            f"{TARGET} is missing: install it with README's test command "
            "(pip install --no-deps --target .venv/transformers-rc1 -r tests/requirements-transformers-rc1.txt)"
        )
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TARGET), os.environ.get("PYTHONPATH", "")])}


def rc1_report(script: str, *args: str) -> dict:
    """The JSON object ``tests/rc1/<script>`` prints last, run with transformers 5.0.0rc1 first on ``sys.path``."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "rc1" / script), *args],
        capture_output=True, text=True, timeout=900, env=rc1_environment(),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


#: CI's families on 5.0.0rc1: the two whose .pte runs, qwen3_next (gated delta rules and experts) and gemma4_text
#: (newer than 5.0.0rc1: refused there by name); every family in the benchmark tier.
RC1_IN_CI = ("gemma3_text", "gemma4_text", "llama", "qwen3_next")


@pytest.fixture(scope="module", params=ci_sample(["sample", "every family"], ["sample"]))
def report(request) -> dict:
    return rc1_report("families.py", *(RC1_IN_CI if request.param == "sample" else ()))


def test_it_runs_on_transformers_5_0_0rc1(report):
    assert report["transformers"] == "5.0.0rc1"


def test_every_family_that_exists_there_matches_hf_eager_and_exports_its_composites(report):
    families = report["families"]
    assert {name for name, r in families.items() if "absent" in r} == NEWER & set(families)
    for name, result in families.items():
        if "absent" in result:
            continue
        assert result["eager_error"] <= 1e-4 * max(result["scale"], 1.0), (name, result)
        counts = {composite: result["composites"].get(composite, 0) for composite in ROWS[name]}
        assert counts == ROWS[name], (name, counts)


def test_its_pte_runs_in_executorchs_runtime_and_matches(report):
    for name in ("llama", "gemma3_text"):
        result = report["families"][name]
        assert result["pte_error"] <= 1e-4 * max(result["scale"], 1.0), (name, result)


@pytest.mark.parametrize("recipe", [pytest.param("coreai", marks=pytest.mark.benchmark), "coreai_device"])  # CI: device
def test_optimum_executorch_exports_with_the_coreai_recipe_and_generates_hf_greedy_tokens(recipe):
    result = rc1_report("optimum_export.py", recipe)
    assert result["transformers"] == "5.0.0rc1"
    assert {"forward", "get_max_seq_len", "get_eos_ids", "get_bos_id"} <= set(result["methods"])
    assert "prefill" not in result["methods"]  # the device form's forward takes the prompt (bounded T)
    # ExecuTorchModelForCausalLM.generate: a one-call prefill, in either form
    assert result["optimum"] == result["hf"]
    assert result["optimum_text"] == result["hf_text"]  # text_generation, through its tokenizer
