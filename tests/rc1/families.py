"""Every family on transformers 5.0.0rc1 (what optimum-executorch 1.1.0 pins): adapt, match HF eager, export.

Run by ``tests/test_transformers_rc1.py`` in a process whose ``sys.path`` starts
with the folder holding 5.0.0rc1 (``.venv/transformers-rc1``).  Prints one
JSON object: per model type, the adapted decoder's largest error against
HF eager over a prefill and four decode steps, the composite call sites of
its export by composite (what ``ROWS`` in ``llm_helpers.py`` counts), and,
for the families in ``PTE``, the error of the ``.pte`` run in ExecuTorch's
runtime.  Model types on the command line check those alone (``tests/test_transformers_rc1.py``'s
CI sample); none, every family.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llm_helpers import adapted_and_eager, prompt_tokens, tiny  # noqa: E402

from coreai_partitioner import text_generation, verify  # noqa: E402
from coreai_partitioner.records.call_sites import call_sites_by_op  # noqa: E402

SHAPES = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=24)
PROMPT = 20
PTE = ("llama", "gemma3_text")


def check(model_type: str) -> dict:
    try:
        model = tiny(model_type)
    except AttributeError as error:  # the family's config class is newer than this transformers
        return {"absent": str(error)}
    got, expected = adapted_and_eager(model_type, SHAPES, PROMPT)
    result = {"eager_error": float((got - expected).abs().max()), "scale": float(expected.abs().max())}
    program, records = text_generation.export_decoder(model, SHAPES)
    tokens = prompt_tokens(PROMPT)
    composite_of = {record.op_name: record.composite_op_name for record in records}
    result["composites"] = Counter(composite_of[op] for op, nodes in call_sites_by_op(program.graph).items() for _ in nodes)
    if model_type in PTE:
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "model.pte"
            path.write_bytes(text_generation.lower_decoder(model, SHAPES).to_executorch().buffer)
            (logits,) = verify.run(path, tokens, torch.arange(PROMPT))
            verify.reset_state(path)
        with torch.no_grad():
            last = model(tokens).logits[:, -1:]
        result["pte_error"] = float((logits - last).abs().max())
    return result


if __name__ == "__main__":
    report = {"transformers": transformers.__version__}
    report["families"] = {model_type: check(model_type) for model_type in (sys.argv[1:] or text_generation.supported())}
    print(json.dumps(report))
