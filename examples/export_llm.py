"""Export a Hugging Face decoder-only LLM to a .pte for ExecuTorch's LLM runner, with Core AI composites.

    python examples/export_llm.py --config qwen3 --verify --generate "Hello"
    python examples/export_llm.py --checkpoint path/to/checkpoint --dtype fp16 --out out/model.pte
    python examples/export_llm.py --checkpoint path/to/checkpoint --num-layers 2 --dry-run
    python examples/export_llm.py --config gemma3_text --shapes enumerated     # static shapes, for the Neural Engine

The .pte has one method, ``forward(tokens [1, T], input_pos [T]) -> logits``
(the last position's, ``[1, 1, vocab]``; every position's with
``--full-logits``), over caches the Core AI delegate owns as state: a prompt
of up to ``--prefill-chunk`` tokens is one call, a decode step is ``T = 1``.
The whole step (embedding, decoder, lm_head; RMSNorm, attention and RoPE as
Core AI composites) is one delegate, with one copy of the weights, plus the
metadata methods ExecuTorch's ``TextLLMRunner`` reads.  The checkpoint's
tokenizer (``tokenizer.json``, a SentencePiece or tiktoken
``tokenizer.model``) is checked with ExecuTorch's runner tokenizers before
anything is exported and copied beside the .pte.  ``--config`` builds a tiny
random model of any family (``coreai_partitioner.llm.supported()``) with a
one-character-per-token tokenizer.  Nothing is downloaded.  Needs the hf
extra: ``pip install -e '.[hf]'``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import os

if "-v" in sys.argv or "--verbose" in sys.argv:
    os.environ["COREAI_PARTITIONER_VERBOSE"] = "1"  # before coreai_partitioner imports its dependencies

from coreai_partitioner import console  # noqa: E402

console.quiet_dependencies()

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from coreai_partitioner import llm, schemes, verify  # noqa: E402
from coreai_partitioner.backends.apple_coreai import debug_info  # noqa: E402
from coreai_partitioner.llm import text, tokenizer  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def fail(message: str) -> None:
    raise SystemExit(f"export_llm.py: error: {message}")


def model_config(args: argparse.Namespace):
    """The config to export (its first ``--num-layers`` layers), refused up front if no family adapts it."""
    from transformers import AutoConfig

    if args.checkpoint:
        if not (args.checkpoint / "config.json").is_file():
            what = "no such directory" if not args.checkpoint.is_dir() else "no config.json in it"
            fail(f"--checkpoint {args.checkpoint}: {what}; give a local Hugging Face checkpoint directory")
        config = AutoConfig.from_pretrained(args.checkpoint, local_files_only=True)
    else:
        config = llm.tiny_config(args.config)
    llm.family_of(config.get_text_config().model_type)  # refused here, before any work, if no family adapts it
    if args.num_layers is not None:
        config = llm.first_layers(config, args.num_layers)
    return config


def choose_tokenizer(args: argparse.Namespace) -> tokenizer.Tokenizer | None:
    """The checkpoint's tokenizer, checked as ExecuTorch's runner loads it, before any export work."""
    if not args.checkpoint or args.no_tokenizer:
        return None
    found = tokenizer.find(args.checkpoint)
    if found is None:
        import warnings

        warnings.warn(
            f"{args.checkpoint} has no tokenizer (tokenizer.json, tokenizer.model, *.tiktoken); the .pte is "
            "exported without one, and ExecuTorch's LLM runner will need one (--no-tokenizer says this is meant)",
            stacklevel=2,
        )
        return None
    try:
        return tokenizer.check(found)
    except tokenizer.TokenizerError as error:
        fail(str(error))


def load_model(args: argparse.Namespace, config) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    dtype = DTYPES[args.dtype]
    if args.checkpoint:
        return AutoModelForCausalLM.from_pretrained(
            args.checkpoint, config=config, dtype=dtype, local_files_only=True, attn_implementation="eager"
        ).eval()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="eager").eval()


def dry_run(args: argparse.Namespace, config, shapes: llm.DecoderShapes, found) -> None:
    """What would be exported, from the config alone (the model is built on the meta device: no weights)."""
    plan = llm.plan(config, shapes, dtype=DTYPES[args.dtype], full_logits=args.full_logits)
    print(plan)
    print(f"  tokenizer: {found.describe() if found else 'one character per token (tiny config)' if not args.checkpoint else 'none'}")
    print(f"  would write {args.out}")


def check(model, pte: Path, shapes: llm.DecoderShapes, quantized, full_logits: bool) -> bool:
    """A one-call prefill's logits and greedy tokens until EOS from the .pte, against HF eager.

    A quantized .pte is judged against the quantized eager program; what the
    quantization cost against the float model is printed beside it.
    """
    import copy

    from coreai_partitioner import quantize

    generator = torch.Generator().manual_seed(1)
    length = min(shapes.prefill_chunk, 8 if shapes.mode == "dynamic" else shapes.prefill_chunk)
    prompt = torch.randint(0, model.config.get_text_config().vocab_size, (1, length), generator=generator)
    positions = torch.arange(length)
    with torch.no_grad():
        expected = model(prompt).logits
    if not full_logits:
        expected = expected[:, -1:]
    with console.NativeStreams():
        verify.reset_state(pte)
        if quantized is None:
            report = verify.check(pte, expected, prompt, positions)
        else:
            report = quantize.check(pte, llm.reset_state(copy.deepcopy(quantized)), expected, prompt, positions)
    which = "every position's" if full_logits else "the last position's"
    reference = "the quantized eager program" if quantized is not None else "Hugging Face eager"
    print(f"\nverify: one-call prefill of {length} tokens, {which} logits, against {reference}:\n{report}")

    start = prompt[0, : min(5, length)].tolist()
    new_tokens = 8
    with console.NativeStreams():
        got = llm.greedy_decode(pte, start, new_tokens, shapes)
    if quantized is None:
        with torch.no_grad():
            wanted = model.generate(torch.tensor([start]), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)[0]
        wanted = wanted.tolist()
    else:
        wanted = eager_greedy(llm.reset_state(copy.deepcopy(quantized)), start, new_tokens, llm.eos_ids_of(pte))
    same = got == wanted
    print(f"\ngreedy, up to {new_tokens} new tokens, stopping at EOS:\n  .pte : {got}\n  eager: {wanted}\n  {'same' if same else 'DIFFERENT'}")
    return report.ok and same


def eager_greedy(module: torch.nn.Module, prompt: list[int], new_tokens: int, eos_ids: tuple[int, ...]) -> list[int]:
    """Greedy tokens from an eager ``forward(tokens, input_pos)`` program (the quantized reference)."""
    with torch.no_grad():
        logits = module(torch.tensor([prompt]), torch.arange(len(prompt)))
        return list(prompt) + list(llm.decode_tokens(module, logits, len(prompt), new_tokens, eos_ids))


def generate(pte: Path, tokenizer_path: Path, prompt: str, shapes: llm.DecoderShapes, new_tokens: int) -> None:
    """The .pte in ExecuTorch's runtime as its LLM runner calls it, the text as it comes, whole characters."""
    print(f"\ngenerate: {prompt!r} -> ", end="", flush=True)
    result = text.generate_text(
        pte, tokenizer_path, prompt, shapes, max_new_tokens=new_tokens, on_text=lambda t: print(t, end="", flush=True)
    )
    print(
        f"\n  prompt {result.prompt_tokens} token(s) in {1000 * result.prompt_seconds:.0f} ms; "
        f"{result.generated_tokens} generated, {result.tokens_per_second:.1f} tokens/s"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", choices=llm.supported(), default="llama", help="a tiny random model of this family")
    source.add_argument("--checkpoint", type=Path, help="a local Hugging Face checkpoint directory")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--num-layers", type=int, help="export the first N layers only (fast trials of a big checkpoint)")
    parser.add_argument("--max-context-len", type=int, default=128, help="cache length (prompt + generated)")
    parser.add_argument("--prefill-chunk", type=int, default=32, help="most tokens one forward call takes")
    parser.add_argument("--shapes", choices=llm.SHAPE_MODES, default="dynamic")
    parser.add_argument("--full-logits", action="store_true", help="forward returns every position's logits")
    parser.add_argument(
        "--quantize",
        choices=tuple(schemes.SCHEMES),
        help="weight-only: int8, int4 (blocks of 32), int4-channel (coreai-opt), palettize4/palettize8 (k-means "
        "look-up tables per 32 output channels), palettize4-mixed; embeddings 8-bit under int4 and int4-channel; "
        "composites stay float",
    )
    parser.add_argument(
        "--keep-float", nargs="+", default=[], metavar="LAYER",
        help="layers --quantize leaves in floating point (decoder module paths, e.g. lm_head layers.0.mlp.down)",
    )
    parser.add_argument(
        "--debug-info", choices=debug_info.LEVELS, default=debug_info.DEFAULT,
        help="what the Core AI asset keeps of the torch source: full = stack traces, for device diagnostics",
    )
    parser.add_argument("--out", type=Path, default=Path("model.pte"))
    parser.add_argument("--no-tokenizer", action="store_true", help="export without the checkpoint's tokenizer")
    parser.add_argument("--dry-run", action="store_true", help="print what would be exported, convert nothing")
    parser.add_argument("--verify", action="store_true", help="check the .pte against HF eager before keeping it")
    parser.add_argument("--generate", metavar="PROMPT", help="generate from the .pte in ExecuTorch's runtime")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("-v", "--verbose", action="store_true", help="show the dependencies' own logs too")
    return parser.parse_args()


#: Errors that say what is wrong with the command's input: one line each, no traceback.
INPUT_ERRORS = (
    llm.UnsupportedModel, llm.UnsupportedConfig, llm.UnsupportedShapes, tokenizer.TokenizerError, schemes.QuantizationError
)


def check_quantize(args: argparse.Namespace, config, shapes: llm.DecoderShapes) -> None:
    """``--quantize`` can store every weight: checked on the meta device, before any weight is loaded."""
    from transformers import AutoModelForCausalLM

    from coreai_partitioner.quantize import check_model

    with torch.device("meta"):
        decoder = llm.adapt(AutoModelForCausalLM.from_config(config), shapes, full_logits=args.full_logits)
    check_model(decoder, args.quantize, keep_float=args.keep_float)


def main() -> None:
    args = parse_args()
    try:
        shapes = llm.DecoderShapes(args.max_context_len, args.prefill_chunk, args.shapes)
    except ValueError as error:
        fail(str(error))
    if args.num_layers is not None and args.num_layers < 1:
        fail(f"--num-layers {args.num_layers}: give at least 1")
    try:
        config = model_config(args)
        if args.quantize:
            check_quantize(args, config, shapes)
        elif args.keep_float:
            fail("--keep-float names layers --quantize leaves float; give --quantize too")
        found = choose_tokenizer(args)
        if args.generate is not None and args.checkpoint and found is None:
            fail("--generate needs a tokenizer, and this export has none")
        if args.dry_run:
            dry_run(args, config, shapes, found)
            return
        args.out.parent.mkdir(parents=True, exist_ok=True)
        partial = args.out.with_name(args.out.name + ".partial")
        try:
            written = export(args, config, shapes, found, partial)
        finally:
            partial.unlink(missing_ok=True)
    except INPUT_ERRORS as error:
        fail(str(error))
    if args.generate is not None:
        generate(args.out, written, args.generate, shapes, args.new_tokens)


def export(args: argparse.Namespace, config, shapes: llm.DecoderShapes, found, partial: Path) -> Path | None:
    """Load, export, write ``partial``, verify it; then it becomes ``--out``, the tokenizer beside it."""
    phases: dict[str, float] = {}
    with tqdm(total=3, unit="phase", leave=False) as bar:
        bar.set_description("load model")
        start = time.perf_counter()
        model = load_model(args, config)
        phases["load"] = time.perf_counter() - start
        bar.update()
        bar.set_description("export and lower")
        start = time.perf_counter()
        quantized: list[torch.nn.Module] = []
        lowered = llm.lower_decoder(
            model,
            shapes,
            full_logits=args.full_logits,
            quantize=args.quantize,
            keep_float=args.keep_float,
            quantized_reference=quantized,
            debug_info=args.debug_info,
        )
        phases["export and lower"] = time.perf_counter() - start
        bar.update()
        bar.set_description("write")
        start = time.perf_counter()
        with open(partial, "wb") as file:
            lowered.to_executorch().write_to_file(file)
        del lowered
        phases["write"] = time.perf_counter() - start
        bar.update()

    pte = read_pte(partial)
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    text_config = model.config.get_text_config()
    print(f"{type(model).__name__} ({text_config.model_type}): {text_config.num_hidden_layers} layer(s), {args.dtype}")
    print(f"  methods: {', '.join(pte.methods)}")
    print(
        f"  forward: {len(pte.coreai_delegates('forward'))} Core AI delegate; T {shapes.mode} up to "
        f"{shapes.prefill_chunk}, context {shapes.max_context_len}, "
        f"{'every position' if args.full_logits else 'last position'}'s logits"
    )
    print(f"  .pte {pte.size:,} bytes, weights {weights:,} bytes ({pte.size / weights:.3f}x)")
    print("  seconds: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items()))
    if args.verify and not check(model, partial, shapes, quantized[0] if quantized else None, args.full_logits):
        fail(f"the .pte does not match the model; {args.out} not written")
    partial.replace(args.out)
    if found is not None:
        copies = tokenizer.copy(found, args.out.parent)
        written = copies[0]
    elif not args.checkpoint:
        written = args.out.parent / "tokenizer.json"
        llm.byte_tokenizer(text_config).save(str(written))
    else:
        written = None
    print(f"wrote {args.out}" + (f" and {written.name}" if written else " (no tokenizer)"))
    return written


if __name__ == "__main__":
    main()
