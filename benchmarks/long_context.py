"""Long context in little memory: KV cache bytes fp16 against int8, and what int8 caches and attention sinks cost in NLL.

    python benchmarks/long_context.py                     # the memory table and real SmolLM2's NLL (about 20 minutes)
    python benchmarks/long_context.py --memory-only       # the table alone (seconds)

1. **Cache bytes** per token and at 4k and 32k tokens, per model shape
   (layers, KV heads, head dim, sliding windows capped at their window),
   fp16 caches against int8 caches with an fp16 scale per token and head
   (``lower_decoder(kv_cache="int8")``); and the bytes the device form's
   ``.pte`` plans for its KV caches, read off its execution plan's buffers by
   name, for real SmolLM2 and a 2-layer Qwen3-0.6B shape (the ratio does not
   depend on the layer count), fp16, at context 1024.
2. **NLL**: real SmolLM2-135M-Instruct (fp32, ``tests/real_checkpoint.py``)
   over the first 2,000 tokens of Python's ``pydoc_data.topics`` text (its
   topics in sorted order, joined by blank lines), teacher-forced through
   ExecuTorch's runtime (the host form): full attention over fp32 caches and
   over int8 caches (a context of 2048, every position's logits, 32 tokens a
   call: the same math as a token a call), and a 256-slot cache with 4 sinks
   against the same cache with none (window attention), a token a call.

The table is printed and written to ``results/long_context.txt``.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
RESULTS = ROOT / "benchmarks" / "results"

#: name -> (layers, KV heads, head dim, {window: sliding layers})
SHAPES = {
    "SmolLM2-135M": (30, 3, 64, {}),
    "Qwen3-0.6B": (28, 8, 128, {}),
    "Llama-3.1-8B": (32, 8, 128, {}),
    "Gemma-3-1B (5 of 6 layers slide over 512)": (26, 1, 256, {512: 22}),
}


def cache_bytes(shape, tokens: int, int8: bool) -> int:
    """The KV caches' bytes of ``shape`` holding ``tokens`` tokens: fp16, or int8 with an fp16 scale a token and head."""
    layers, heads, dim, windows = shape
    row = heads * (dim + 2 if int8 else 2 * dim)  # one token's keys (or values) of one layer
    sliding = sum(windows.values())
    held = (layers - sliding) * tokens + sum(count * min(window, tokens) for window, count in windows.items())
    return 2 * row * held


def memory_table() -> list[str]:
    lines = ["| shape | bytes/token fp16 | bytes/token int8 | 4k fp16 | 4k int8 | 32k fp16 | 32k int8 | int8/fp16 |", "|---|---|---|---|---|---|---|---|"]
    mb = 1e6
    for name, shape in SHAPES.items():
        per = [cache_bytes(shape, 1, q) for q in (False, True)]
        at = {n: [cache_bytes(shape, n, q) for q in (False, True)] for n in (4096, 32768)}
        lines.append(
            f"| {name} | {per[0]:,} | {per[1]:,} | {at[4096][0] / mb:,.1f} MB | {at[4096][1] / mb:,.1f} MB | "
            f"{at[32768][0] / mb:,.1f} MB | {at[32768][1] / mb:,.1f} MB | {at[32768][1] / at[32768][0]:.3f} |"
        )
    return lines


def planned_kv_bytes(model, context: int) -> int:
    """The device form's planned KV cache bytes (scales included) of ``model`` at ``context``, int8 and fp."""
    import torch

    from coreai_partitioner import text_generation
    from coreai_partitioner.lowering.device import executorch_config
    from executorch.exir.schema import Tensor

    sizes = {1: 1, 5: 2, 6: 4}  # int8, half, float (ExecuTorch's ScalarType)
    shapes = text_generation.DecoderShapes(max_context_len=context, prefill_chunk=4, target="device")
    planned = {}
    for kv in ("fp", "int8"):
        program = text_generation.lower_decoder(model, shapes, kv_cache=kv).to_executorch(executorch_config())
        (plan,) = [p for p in program.executorch_program.execution_plan if p.name == "forward"]
        total = 0
        for value in plan.values:
            tensor = value.val
            info = getattr(tensor, "extra_tensor_info", None) if isinstance(tensor, Tensor) else None
            if info is not None and (info.fully_qualified_name or "").endswith("_cache"):
                total += sizes[int(tensor.scalar_type)] * math.prod(tensor.sizes)
        planned[kv] = (total, list(plan.non_const_buffer_sizes))
        del program
    return planned


def text_tokens(tokenizer, count: int) -> list[int]:
    import pydoc_data.topics

    text = "\n\n".join(pydoc_data.topics.topics[name] for name in sorted(pydoc_data.topics.topics))
    ids = tokenizer(text[: 20 * count])["input_ids"]
    assert len(ids) >= count, len(ids)
    return ids[:count]


def nll(logits, tokens: list[int]) -> float:
    """The mean negative log-likelihood of ``tokens[1:]`` under ``logits`` [len(tokens) - 1, vocab] (each row the
    prediction of the next token)."""
    import torch

    target = torch.tensor(tokens[1:])
    return float(torch.nn.functional.cross_entropy(logits.float(), target))


def run_chunks(path, tokens: list[int], chunk: int):
    import torch

    from coreai_partitioner import verify

    verify.reset_state(path)
    rows = []
    for start in range(0, len(tokens) - 1, chunk):
        piece = tokens[start : min(start + chunk, len(tokens) - 1)]
        rows.append(verify.run(path, torch.tensor([piece]), torch.arange(start, start + len(piece)))[0][0])
    return torch.cat(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-only", action="store_true")
    parser.add_argument("--part", choices=("all", "nll", "sinks", "planned"), default="all",
                        help="the measured part to run (results_file names it: long_context[_PART].txt)")
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--checkpoint-dir", type=Path, default=Path(tempfile.gettempdir()) / "smollm2-135m-instruct")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    lines = ["KV cache bytes (keys and values, every layer; int8 = int8 values and an fp16 scale per token and head)", ""]
    lines += memory_table()
    text = "\n".join(lines)
    print(text, flush=True)
    args.results.mkdir(parents=True, exist_ok=True)
    name = "long_context.txt" if args.part == "all" else f"long_context_{args.part}.txt"
    args.partial = lambda more: (args.results / name).write_text(text + "\n\n" + "\n".join(more) + "\n")
    args.partial([])
    if not args.memory_only:
        args.partial(measured(args))


def measured(args) -> list[str]:
    import torch
    from real_checkpoint import smollm2_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coreai_partitioner import save_pte, text_generation
    from coreai_partitioner.blocks.sinks import attention_sinks

    checkpoint = smollm2_checkpoint(args.checkpoint_dir)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="eager").eval()
    tokens = text_tokens(tokenizer, args.tokens)
    lines = ["", f"Real SmolLM2-135M-Instruct (fp32) NLL over {len(tokens):,} tokens of pydoc_data.topics, teacher-forced "
              "through ExecuTorch's runtime (host form)", "",
              "| caches | context | calls | mean NLL (nats) | vs full fp32 | seconds |", "|---|---|---|---|---|---|"]
    rows = []
    runs = [
        ("full attention, fp32 caches", dict(kv_cache="fp"), 2048, 32, None),
        ("full attention, int8 caches", dict(kv_cache="int8"), 2048, 32, None),
        ("256-slot cache, 4 sinks + ring of 252", {}, 256, 1, 4),
        ("256-slot ring, no sinks (window attention)", {}, 256, 1, 0),
    ]
    runs = {"planned": [], "nll": runs[:2], "sinks": runs[2:]}.get(args.part, runs)
    with tempfile.TemporaryDirectory() as directory:
        for label, options, context, chunk, sinks in runs:
            start = time.perf_counter()
            shapes = text_generation.DecoderShapes(max_context_len=context, prefill_chunk=max(chunk, 4))
            decoder = text_generation.adapt(model, shapes, full_logits=True)
            if sinks is not None:
                attention_sinks(decoder, sinks, shapes.prefill_chunk)
            path = save_pte(text_generation.lower_decoder(model, shapes, decoder=decoder, full_logits=True, **options),
                            Path(directory) / "model.pte")
            value = nll(run_chunks(path, tokens, chunk), tokens)
            rows.append((label, context, -(-(len(tokens) - 1) // chunk), value, time.perf_counter() - start))
            base = rows[0][3] if args.part != "sinks" else math.nan  # the full fp32 row is --part nll's
            lines.append(f"| {label} | {context} | {rows[-1][2]:,} | {value:.4f} | {100 * (value / base - 1):+.2f}% | {rows[-1][4]:.0f} |")
            print(lines[-1], flush=True)
            args.partial(lines)
    if args.part in ("nll", "sinks"):
        return lines
    lines += [""]
    lines += ["Device form's planned KV cache bytes (fp16 model, context 1024, read off the .pte's execution plan)", ""]
    lines += ["| model | fp16 caches | int8 caches | int8/fp16 | planned arenas fp16 | planned arenas int8 |", "|---|---|---|---|---|---|"]
    torch.manual_seed(0)
    qwen = text_generation.tiny_config("qwen3")
    for name, value in dict(num_hidden_layers=2, num_key_value_heads=8, num_attention_heads=16, head_dim=128,
                            hidden_size=1024, intermediate_size=512, vocab_size=1024, max_position_embeddings=40960).items():
        setattr(qwen, name, value)
    for label, fp16_model in (("Qwen3-0.6B shape, 2 layers", AutoModelForCausalLM.from_config(qwen).eval().half()),
                              ("real SmolLM2-135M", copy.deepcopy(model).half())):
        planned = planned_kv_bytes(fp16_model, 1024)
        (fp, fp_arenas), (q, q_arenas) = planned["fp"], planned["int8"]
        lines.append(f"| {label} | {fp:,} | {q:,} | {q / fp:.3f} | {fp_arenas} | {q_arenas} |")
        print(lines[-1], flush=True)
        args.partial(lines)
        del fp16_model

    return lines


if __name__ == "__main__":
    main()
