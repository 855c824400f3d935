"""Time to first token through ExecuTorch's stock TextLLMRunner: the device form's static and bounded layouts.

    python benchmarks/prefill.py                         # both layouts, one run; results/prefill.{txt,json,png}
    python benchmarks/prefill.py --layers 4 --dim 256 --chunk 32 --prompts 64 256

A random Llama (``--dim``, ``--layers``, the one-character-per-token
vocabulary of the tiny configs, so a prompt of N characters is N tokens) is
exported in the device form twice, each in a process of its own:
``--device-shapes static`` (``forward`` T = 1 beside ``prefill`` T = chunk;
``enable_dynamic_shape`` false, so ``TextLLMRunner`` feeds the prompt a
token a call) and ``bounded`` (one ``forward`` taking T from 1 to the chunk;
the runner prefills in calls of the chunk).  Each process times the export
and then ``TextLLMRunner`` (``text_generation.runner.Runner``, its own stats) on each
prompt length, a few times: prompt evaluation (time to first token) and one
decode step; and reports its peak RSS.  The table puts the two layouts side
by side.  Runs on this machine's Core AI runtime (Linux CPU, fp32): what
the ratios show is the number of calls, not a device's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
LAYOUTS = ("static", "bounded")


def worker(args: argparse.Namespace) -> dict:
    """One layout: export, then TextLLMRunner on each prompt length; a JSON-able result."""
    from coreai_partitioner import console

    console.quiet_dependencies()
    import torch
    import transformers

    from coreai_partitioner import text_generation, save_pte
    from coreai_partitioner.text_generation.runner import Runner

    config = transformers.LlamaConfig(
        hidden_size=args.dim, intermediate_size=2 * args.dim, num_hidden_layers=args.layers,
        num_attention_heads=args.dim // 64, num_key_value_heads=max(args.dim // 128, 1), head_dim=64,
        vocab_size=256, max_position_embeddings=args.context, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    shapes = text_generation.DecoderShapes(args.context, args.chunk, target="device", device_shapes=args.layout)
    with tempfile.TemporaryDirectory() as directory:
        pte = Path(directory) / "model.pte"
        started = time.perf_counter()
        save_pte(text_generation.lower_decoder(model, shapes), pte)
        export_s = time.perf_counter() - started
        text_generation.byte_tokenizer(config).save(str(Path(directory) / "tokenizer.json"))
        runner = Runner(pte, Path(directory) / "tokenizer.json")
        rows = {}
        for length in args.prompts:
            text = "".join(chr(ord("a") + i % 26) for i in range(length - 1))  # + BOS: `length` prompt tokens
            runs = [runner.generate(text, max_new_tokens=args.new_tokens) for _ in range(args.repeat)]
            rows[length] = {
                "prompt_tokens": runs[0].prompt_tokens,
                "ttft_s": statistics.median(r.prompt_seconds for r in runs),
                "decode_step_s": statistics.median(r.decode_seconds / max(r.generated_tokens - 1, 1) for r in runs),
            }
    return {
        "layout": args.layout,
        "export_s": export_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "prompts": rows,
    }


def table(results: list[dict], args: argparse.Namespace) -> str:
    head = ["layout", "export s", "peak RSS MB", "decode step (ms)"]
    for length in args.prompts:
        head += [f"TTFT {length} tok (ms)", f"/ decode step"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for result in results:
        step = statistics.median(row["decode_step_s"] for row in result["prompts"].values())
        cells = [result["layout"], f"{result['export_s']:.1f}", f"{result['peak_rss_mb']:,.0f}", f"{1000 * step:.0f}"]
        for length in args.prompts:
            row = result["prompts"][str(length)]
            cells += [f"{1000 * row['ttft_s']:,.0f}", f"{row['ttft_s'] / row['decode_step_s']:.1f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    """Time to first token against prompt length, a line per layout, one decode step dashed beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.6))
    for result in results:
        lengths = sorted(int(n) for n in result["prompts"])
        ttft = [1000 * result["prompts"][str(n)]["ttft_s"] for n in lengths]
        line, = axis.plot(lengths, ttft, marker="o", label=f"{result['layout']}: time to first token")
        step = 1000 * statistics.median(result["prompts"][str(n)]["decode_step_s"] for n in lengths)
        axis.axhline(step, linestyle="--", color=line.get_color(), linewidth=0.8, label=f"{result['layout']}: one decode step")
    axis.set_xlabel("prompt tokens")
    axis.set_ylabel("ms (TextLLMRunner, Linux CPU runtime)")
    axis.set_yscale("log")
    axis.legend(fontsize=8)
    axis.set_title("Device form: static layout vs bounded forward", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--context", type=int, default=320)
    parser.add_argument("--prompts", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--new-tokens", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layout", choices=LAYOUTS, help=argparse.SUPPRESS)  # a worker's
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.layout:
        print(json.dumps(worker(args)))
        return
    results = []
    load = os.getloadavg()[0]
    for layout in LAYOUTS:
        command = [sys.executable, __file__, *sys.argv[1:], "--layout", layout]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    text = (
        f"Device-form Llama, d {args.dim}, {args.layers} layers, chunk {args.chunk}, context {args.context}, fp32, "
        f"random weights; TextLLMRunner, median of {args.repeat} (`python benchmarks/prefill.py "
        + " ".join(sys.argv[1:]) + f"`); load average {load:.1f} before, {os.getloadavg()[0]:.1f} after, "
        f"on {os.cpu_count()} cores\n\n" + table(results, args) + "\n"
    )
    print(text)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "prefill.txt").write_text(text)
    (args.results / "prefill.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, args.results / "prefill.png")


if __name__ == "__main__":
    main()
