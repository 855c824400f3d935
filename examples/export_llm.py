"""Export a Hugging Face decoder-only LLM (Llama, Qwen2, Qwen3, Mistral) to a .pte for ExecuTorch's LLM runner.

    python examples/export_llm.py --config qwen3 --verify --generate "Hello"
    python examples/export_llm.py --checkpoint path/to/local/hf/checkpoint --dtype fp16 --out out/model.pte
    python examples/export_llm.py --config llama --shapes enumerated      # static shapes, for the Neural Engine

The .pte has one method, ``forward(tokens [1, T], input_pos [T]) -> logits``,
over a static KV cache the Core AI delegate owns as state: a prompt of up to
``--prefill-chunk`` tokens is one call, a decode step is ``T = 1``.  The whole
step (embedding, decoder, lm_head; RMSNorm, attention and RoPE as Core AI
composites) is one delegate, with one copy of the weights, plus the metadata
methods ExecuTorch's ``TextLLMRunner`` reads.  ``tokenizer.json`` is written
beside the .pte (the checkpoint's, or a byte-level one for the tiny configs).
``--shapes dynamic`` exports ``T`` as a dimension (GPU and CPU); ``--shapes
enumerated`` compiles ``T`` in {1, chunk} as entrypoints of one asset sharing
the weights (the Neural Engine needs static shapes).  Nothing is downloaded.
Needs the hf extra: ``pip install -e '.[hf]'``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message="coreai-torch has only been validated")

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from coreai_partitioner import llm as hf, verify  # noqa: E402
from coreai_partitioner.backends.apple_coreai import debug_info  # noqa: E402
from coreai_partitioner.pte import read_pte  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def load_model(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    if args.checkpoint:
        config = AutoConfig.from_pretrained(args.checkpoint, local_files_only=True)
        if config.model_type not in hf.SUPPORTED:
            raise SystemExit(
                f"{args.checkpoint} is a {config.model_type!r} checkpoint; this example exports "
                f"{', '.join(hf.SUPPORTED)} (coreai_partitioner.hf.SUPPORTED)"
            )
        return AutoModelForCausalLM.from_pretrained(
            args.checkpoint, torch_dtype=DTYPES[args.dtype], local_files_only=True
        ).eval()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(hf.tiny_config(args.config)).to(DTYPES[args.dtype]).eval()


def write_tokenizer(model: torch.nn.Module, args: argparse.Namespace) -> Path:
    path = args.out.parent / "tokenizer.json"
    if args.checkpoint:
        source = args.checkpoint / "tokenizer.json"
        if not source.exists():
            raise SystemExit(f"{args.checkpoint} has no tokenizer.json; ExecuTorch's LLM runner needs one")
        if source.resolve() != path.resolve():
            shutil.copyfile(source, path)
    else:
        hf.byte_tokenizer(model.config).save(str(path))
    return path


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters, a tied embedding counted once."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def eager_greedy(module: torch.nn.Module, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy tokens from an eager ``forward(tokens, input_pos)`` program (the quantized reference)."""
    tokens = list(prompt)
    with torch.no_grad():
        logits = module(torch.tensor([tokens]), torch.arange(len(tokens)))
        for _ in range(new_tokens):
            tokens.append(int(logits[0, -1].argmax()))
            logits = module(torch.tensor([[tokens[-1]]]), torch.tensor([len(tokens) - 1]))
    return tokens


def check(model: torch.nn.Module, pte: Path, shapes: hf.DecoderShapes, quantized: torch.nn.Module | None) -> bool:
    """A one-call prefill's logits and 8 greedy tokens from the .pte, against HF eager.

    A quantized .pte is judged against the quantized eager program; its error
    against the float model is printed too, so what quantization cost shows.
    """
    import copy

    from coreai_partitioner import quantize

    generator = torch.Generator().manual_seed(1)
    length = min(shapes.prefill_chunk, 8 if shapes.mode == "dynamic" else shapes.prefill_chunk)
    prompt = torch.randint(0, model.config.vocab_size, (1, length), generator=generator)
    positions = torch.arange(length)
    with torch.no_grad():
        expected = model(prompt).logits
    verify.reset_state(pte)
    if quantized is None:
        report = verify.check(pte, expected, prompt, positions)
    else:
        report = quantize.check(pte, copy.deepcopy(quantized), expected, prompt, positions)
    print(f"\none-call prefill of {length} tokens vs {'the quantized eager program' if quantized else 'Hugging Face eager'}:\n{report}")
    start = prompt[0, : min(5, length)].tolist()
    got = hf.greedy_decode(pte, start, 8, shapes)
    if quantized is None:
        with torch.no_grad():
            wanted = model.generate(torch.tensor([start]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0].tolist()
    else:
        wanted = eager_greedy(copy.deepcopy(quantized), start, 8)
    same = got == wanted[: len(got)] and len(got) >= len(wanted)
    print(f"\ngreedy, 8 tokens:\n  .pte : {got}\n  eager: {wanted}\n  {'same' if same else 'DIFFERENT'}")
    return report.ok and same


def generate(pte: Path, tokenizer: Path, prompt: str, new_tokens: int) -> None:
    """Run ExecuTorch's own TextLLMRunner on the .pte, Core AI delegates on the host backend."""
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    from coreai_partitioner import load_runtime_backend

    load_runtime_backend()
    runner = TextLLMRunner(str(pte), str(tokenizer))
    pieces: list[str] = []
    stats = []
    config = GenerationConfig(max_new_tokens=new_tokens, temperature=0.0, echo=False)
    runner.generate(prompt, config, token_callback=pieces.append, stats_callback=stats.append)
    print(f"\nTextLLMRunner: {prompt!r} -> {''.join(pieces)!r}")
    if stats:
        s = stats[-1]
        decode_ms = s.inference_end_ms - s.prompt_eval_end_ms
        print(
            f"  prompt {s.num_prompt_tokens} token(s) in {s.prompt_eval_end_ms - s.inference_start_ms} ms; "
            f"{s.num_generated_tokens} generated, "
            f"{1000 * max(s.num_generated_tokens - 1, 0) / max(decode_ms, 1):.1f} tokens/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", choices=("llama", "qwen2", "qwen3", "mistral"), default="llama")
    source.add_argument("--checkpoint", type=Path, help="a local Hugging Face checkpoint directory")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--max-context-len", type=int, default=128, help="KV cache length (prompt + generated)")
    parser.add_argument("--prefill-chunk", type=int, default=32, help="most tokens one forward call takes")
    parser.add_argument("--shapes", choices=hf.SHAPE_MODES, default="dynamic")
    parser.add_argument(
        "--quantize",
        choices=("int8", "int4"),
        help="weight-only, with coreai-opt: int8 per channel, int4 in blocks of 32; composites stay float",
    )
    parser.add_argument(
        "--debug-info", choices=debug_info.LEVELS, default=debug_info.DEFAULT,
        help="what the Core AI asset keeps of the torch source: full = stack traces, for device diagnostics",
    )
    parser.add_argument("--out", type=Path, default=Path("model.pte"))
    parser.add_argument("--verify", action="store_true", help="check the .pte against HF eager")
    parser.add_argument("--generate", metavar="PROMPT", help="run ExecuTorch's TextLLMRunner on the .pte")
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    shapes = hf.DecoderShapes(args.max_context_len, args.prefill_chunk, args.shapes)
    args.out.parent.mkdir(parents=True, exist_ok=True)

    phases: dict[str, float] = {}
    with tqdm(total=3, unit="phase") as bar:
        bar.set_description("load model")
        start = time.perf_counter()
        model = load_model(args)
        phases["load"] = time.perf_counter() - start
        bar.update()
        bar.set_description("export and lower")
        start = time.perf_counter()
        quantized: list[torch.nn.Module] = []
        lowered = hf.lower_decoder(
            model, shapes, quantize=args.quantize, quantized_reference=quantized, debug_info=args.debug_info
        )
        phases["export and lower"] = time.perf_counter() - start
        bar.update()
        bar.set_description("serialize")
        start = time.perf_counter()
        partial = args.out.with_suffix(args.out.suffix + ".partial")
        with open(partial, "wb") as file:
            lowered.to_executorch().write_to_file(file)
        partial.replace(args.out)
        del lowered
        phases["serialize"] = time.perf_counter() - start
        bar.update()
    tokenizer = write_tokenizer(model, args)

    pte = read_pte(args.out)
    weights = weight_bytes(model)
    delegates = [d for d in pte.delegates if d.method == "forward"]
    print(f"\n{type(model).__name__}: {model.config.num_hidden_layers} layer(s), {model.dtype} -> {args.out}, {tokenizer}")
    print(f"  methods: {', '.join(pte.methods)}")
    print(f"  forward: {len(delegates)} Core AI delegate(s); T {shapes.mode} up to {shapes.prefill_chunk}, context {shapes.max_context_len}")
    print(f"  .pte {pte.size:,} bytes, weights {weights:,} bytes ({pte.size / weights:.3f}x)")
    print("  seconds: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items()))
    ok = True
    if args.verify:
        ok = check(model, args.out, shapes, quantized[0] if quantized else None)
    if args.generate is not None:
        generate(args.out, tokenizer, args.generate, args.new_tokens)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
