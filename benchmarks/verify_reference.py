"""``export --quantize --verify``'s fp32 reference of a checkpoint larger than memory, a module at a time.

    python benchmarks/verify_reference.py --cache-dir CKPTS [--row qwen3-14b-int4-streamed] [--results DIR]

The checkpoint is ``benchmarks/llm.py``'s for the row (written once under
``--cache-dir``; Qwen3-14B's shape in bf16 by default, 29.54 GB).  The
reference is what ``cli/task.py``'s ``auto_model`` loads when ``layer_by_layer`` holds:
the model loaded with every weight left in the checkpoint
(``streamed.load_streamed`` without a scheme), run under
``checkpoints.read_while_running`` by ``text_generation.check.reference``
(an 8-token random prompt, 8 greedy tokens, their logits), at the shapes
``export`` uses by default.  Prints time and peak RSS (the kernel's
high-water mark) and writes ``verify_reference.txt``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import llm  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--row", default="qwen3-14b-int4-streamed", choices=[r for r in llm.ROWS if not r.startswith("tiny")])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    args = parser.parse_args()
    path = llm.checkpoint(args.row, args.cache_dir)  # written if missing

    import torch
    from transformers import AutoModelForCausalLM

    from coreai_partitioner import text_generation
    from coreai_partitioner import checkpoints
    from coreai_partitioner.quantize import streamed
    from coreai_partitioner.text_generation import check

    start = time.perf_counter()
    model = streamed.load_streamed(AutoModelForCausalLM, path, llm.stored_config(path), torch.float32)
    loaded = time.perf_counter() - start
    fp32 = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) * 4
    shapes = text_generation.DecoderShapes(max_context_len=128, prefill_chunk=32)  # export's defaults
    start = time.perf_counter()
    with checkpoints.read_while_running(model):
        reference = check.reference(model, shapes)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    text = (
        f"{args.row}'s checkpoint ({path.name}): fp32 reference of --verify, a module at a time "
        f"(checkpoints.read_while_running), {len(reference.prompt)}-token prompt and {len(reference.tokens)} greedy "
        f"tokens; one process, alone\n\n"
        f"    python benchmarks/verify_reference.py --cache-dir CKPTS --row {args.row}\n\n"
        "row                        fp32 weights GB  load s  reference s  peak RSS GB  peak RSS GiB\n"
        "-----------------------------------------------------------------------------------------\n"
        f"{args.row:26} {fp32 / 1e9:15.2f} {loaded:7.1f} {seconds:12.1f} {peak / 1e9:12.2f} {peak / (1 << 30):13.2f}\n"
    )
    print(text)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "verify_reference.txt").write_text(text)


if __name__ == "__main__":
    main()
