"""What one decode step copies, counted from the graphs: this package's device form beside ExecuTorch's static-attention Llama.

    python benchmarks/decode_copies.py                        # the Qwen3-0.6B shape, context 2048, fp16
    python benchmarks/decode_copies.py --layers 16 --kv-heads 8 --head-dim 64 --context 4096 --vocab 128256

Counts bytes, not seconds: nothing here can time a device.  For one token
(T = 1) at a context of ``--context`` slots:

* **this package's device form** (``text_decoder/device.py``, either layout): the
  token and position cross as fp32; each layer's K and V caches are inputs
  the runtime borrows (upstream's ``borrow_inputs``: no copy), then inside
  the delegate each is read through :func:`~coreai_partitioner.blocks.written_only`
  (a select over the whole cache, which the compiler may fuse with the next
  copy) and concatenated with the call's new row (``torch.cat``: a new tensor
  of ``context + 1`` rows); the new rows come out and ExecuTorch writes them
  into the caches (``index_put_``); the last position's logits come out.
* **ExecuTorch's static-attention Llama** (``examples/models/llama/static_attention.py``,
  what ``examples/apple/coreml/llama/export_static_llm_coreml.py`` exports):
  its ``StaticKVCache.update`` concatenates each cache of ``context - T``
  slots with the new row (``torch.cat``), returns the new rows, and its C++
  IO manager copies them into the caches; a float mask of ``context`` slots
  goes in.

The table is printed and written to ``results/decode_copies.txt``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def counts(layers: int, kv_heads: int, head_dim: int, context: int, vocab: int, element: int) -> list[tuple[str, int, int]]:
    """``(what, this package's bytes, static attention's bytes)`` per decode step."""
    row = kv_heads * head_dim * element  # one position's keys (or values) of one layer
    caches = 2 * layers
    return [
        ("inputs: token, position (fp32) / token, position, mask", 8, 8 + 8 + context * element),
        ("caches into the delegate (borrowed)", 0, 0),
        ("unwritten slots selected away (written_only; may fuse)", caches * context * row, 0),
        ("cache concatenated with the new row (torch.cat)", caches * (context + 1) * row, caches * context * row),
        ("new K/V rows out of the delegate", caches * row, caches * row),
        ("new rows written into the caches", caches * row, caches * row),
        ("logits out (last position, fp32)", 4 * vocab, 4 * vocab),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--bytes", type=int, default=2, help="bytes per cache element (2: fp16)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = counts(args.layers, args.kv_heads, args.head_dim, args.context, args.vocab, args.bytes)
    lines = [
        f"One decode step (T = 1): {args.layers} layers, {args.kv_heads} KV heads of {args.head_dim}, context "
        f"{args.context}, {8 * args.bytes}-bit caches, vocabulary {args.vocab:,} "
        f"(`python benchmarks/decode_copies.py {' '.join(f'--{k.replace(chr(95), chr(45))} {v}' for k, v in vars(args).items() if k != 'results')}`)",
        "",
        "| bytes per step | this package's device form | ExecuTorch static-attention Llama |",
        "|---|---|---|",
    ]
    lines += [f"| {what} | {ours:,} | {theirs:,} |" for what, ours, theirs in rows]
    lines.append(f"| **total** | **{sum(r[1] for r in rows):,}** | **{sum(r[2] for r in rows):,}** |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "decode_copies.txt").write_text(text)


if __name__ == "__main__":
    main()
