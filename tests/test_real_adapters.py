"""The real SmolLM2-135M-Instruct with two adapters trained on made-up facts, exported by the package command.

``export --adapter moonopolis=DIR --adapter armstrong=DIR`` writes
``model.pte``, ``model.ptd`` and one ``.pte`` per adapter; ``--chat`` asks
each program the question through ExecuTorch's ``TextLLMRunner`` with the
base's ``.ptd`` as its ``data_path``.  Each answer is PEFT's own greedy
answer with that adapter active and unmerged (``tests/real_adapters.py``),
the base's the base model's; the files hold the issue's sizes.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from requires import require

require("transformers", "hf")
require("peft", "test")

from real_adapters import ADAPTERS, BASE_ANSWER, NEW_TOKENS, QUESTION, base_answer, peft_answer  # noqa: E402

pytestmark = pytest.mark.slow


def test_the_real_model_and_two_trained_adapters_answer_through_text_llm_runner_as_peft_does(
    real_checkpoint, real_adapters, tmp_path
):
    from coreai_partitioner.adapters.config import read_adapter
    from transformers import AutoConfig

    out = tmp_path / "model.pte"
    command = [
        sys.executable, "-m", "coreai_partitioner", "export", "--checkpoint", str(real_checkpoint),
        "--max-context-len", "64", "--prefill-chunk", "48", "--chat", QUESTION, "--new-tokens", str(NEW_TOKENS),
        *(f"--adapter={name}={path}" for name, path in real_adapters.items()), "--out", str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    # The programs and the one data file; beside them the checkpoint's tokenizer files, copied as they are.
    written = {p.name for p in tmp_path.iterdir()}
    assert {name for name in written if name.endswith((".pte", ".ptd"))} == {
        "model.pte", "model.ptd", *(f"{name}.pte" for name in real_adapters)
    }, done.stdout
    assert "tokenizer.json" in written, done.stdout

    answers = dict(re.findall(r"^chat\[(\w+)\]: .* -> (.*)$", done.stdout, flags=re.MULTILINE))
    expected = {"model": base_answer(real_checkpoint).text}
    expected.update({name: peft_answer(real_checkpoint, path).text for name, path in real_adapters.items()})
    assert answers == expected, done.stdout
    # Each adapter answers with its own made-up fact, the base with neither: each program runs its own pairs.
    assert expected == {"model": BASE_ANSWER, **{name: adapter.answer for name, adapter in ADAPTERS.items()}}

    # Disk: the .ptd at most 1.02x the base weights, each adapter at most 1.1x its pairs plus 64 kB, the base
    # .pte (graph, metadata, rank-1 zero pairs) at most 2% of the weights.
    config = AutoConfig.from_pretrained(real_checkpoint)
    weights = int(re.search(r"weights ([\d,]+) bytes", done.stdout).group(1).replace(",", ""))
    assert (tmp_path / "model.ptd").stat().st_size <= 1.02 * weights
    assert out.stat().st_size <= 0.02 * weights
    for name, path in real_adapters.items():
        adapter = read_adapter(name, path, config)
        assert (tmp_path / f"{name}.pte").stat().st_size <= 1.1 * adapter.nbytes + 64_000
        assert all(layer.a.dtype == torch.float32 for layer in adapter.layers.values())
