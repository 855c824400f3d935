"""Export a Hugging Face decoder-only LLM to a .pte for ExecuTorch's LLM runner, with Core AI composites.

    python -m coreai_partitioner export-llm --config qwen3 --verify --generate "Hello"
    python -m coreai_partitioner export-llm --checkpoint path/to/checkpoint --dtype fp16 --verify --out out/model.pte
    python -m coreai_partitioner export-llm --checkpoint path/to/checkpoint --chat "What is the capital of France?"
    python -m coreai_partitioner export-llm --checkpoint path/to/checkpoint --num-layers 2 --dry-run
    python -m coreai_partitioner export-llm --config gemma3_text --shapes enumerated     # static shapes, for the Neural Engine

(``coreai-export-llm`` and ``examples/export_llm.py`` are the same command.)
The .pte has one method, ``forward(tokens [1, T], input_pos [T]) -> logits``
(the last position's, ``[1, 1, vocab]``; every position's with
``--full-logits``), over caches the Core AI delegate owns as state: a prompt
of up to ``--prefill-chunk`` tokens is one call, a decode step is ``T = 1``.
The whole step (embedding, decoder, lm_head; RMSNorm, attention and RoPE as
Core AI composites) is one delegate, with one copy of the weights, plus the
metadata methods ExecuTorch's ``TextLLMRunner`` reads.  The checkpoint's
tokenizer (``tokenizer.json``, a SentencePiece or tiktoken
``tokenizer.model``) is checked with ExecuTorch's runner tokenizers before
anything is exported and copied beside the .pte with its chat template.
``--verify`` judges the .pte against the eager model it was lowered from
(the quantized eager model for ``--quantize``), within the runtime's own
rounding, and reports how far it is from the fp32 model, before keeping it
(:mod:`coreai_partitioner.llm.check`).  ``--chat`` applies the checkpoint's
chat template to a message and answers it through ``TextLLMRunner``;
``--generate`` continues raw text.  ``--config`` builds a tiny random model
of any family (``coreai_partitioner.llm.supported()``) with a
one-character-per-token tokenizer.  Nothing is downloaded.  Needs the hf
extra: ``pip install 'coreai-partitioner[hf]'``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner import console
from coreai_partitioner.cli.command import CommandError, run_command
from coreai_partitioner.backends.apple_coreai import debug_info
from coreai_partitioner.quantize import SCHEMES

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}

#: Options that are ``llm.lower_decoder`` keywords, by flag: argparse's ``dest`` is the keyword.  One line each.
LOWERING_OPTIONS: dict[str, dict[str, Any]] = {
    "--full-logits": dict(action="store_true", help="forward returns every position's logits"),
    "--quantize": dict(
        choices=tuple(SCHEMES),
        help=(  # argparse formats help with %: a scheme's "12%" is written %%
            "weight-only, with coreai-opt: " + "; ".join(SCHEMES.values()) + "; composites stay float"
        ).replace("%", "%%"),
    ),
    "--graph-breaks": dict(
        type=int, metavar="N", help="device form: a Core AI delegate per N layers, each a function of the one asset"
    ),
    "--debug-info": dict(
        choices=debug_info.LEVELS,
        default=debug_info.DEFAULT,
        help="what the Core AI asset keeps of the torch source: full = stack traces, for device diagnostics",
    ),
}


def tiny_configs() -> list[str]:
    """The ``--config`` names: a tiny random model of each family (``python -m coreai_partitioner export`` asks)."""
    from coreai_partitioner.llm import supported

    return list(supported())


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from coreai_partitioner.llm import DEVICE_SHAPES, SHAPE_MODES, TARGETS, supported

    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", choices=supported(), default="llama", help="a tiny random model of this family")
    source.add_argument("--checkpoint", type=Path, help="a local Hugging Face checkpoint directory")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--num-layers", type=int, help="export the first N layers only (fast trials of a big checkpoint)")
    parser.add_argument("--max-context-len", type=int, default=128, help="cache length (prompt + generated)")
    parser.add_argument("--prefill-chunk", type=int, default=32, help="most tokens one forward call takes")
    parser.add_argument("--shapes", choices=SHAPE_MODES, default="dynamic", help="the host form's shapes")
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="host",
        help="host: this package's runtime (caches as delegate state); device: upstream's on-device Core AI runtime "
        "(CoreAIBackend, fp16/fp32 tensors only, caches owned by ExecuTorch)",
    )
    parser.add_argument(
        "--device-shapes",
        choices=DEVICE_SHAPES,
        default="bounded",
        help="the device form's layout: bounded = one forward taking T from 1 to --prefill-chunk (TextLLMRunner "
        "prefills in chunks); static = forward T=1 beside prefill T=chunk (fixed shapes; TextLLMRunner feeds "
        "the prompt token by token)",
    )
    for flag, options in LOWERING_OPTIONS.items():
        parser.add_argument(flag, **options)
    parser.add_argument("--out", type=Path, default=Path("model.pte"))
    parser.add_argument("--no-tokenizer", action="store_true", help="export without the checkpoint's tokenizer")
    parser.add_argument("--dry-run", action="store_true", help="print what would be exported, convert nothing")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="judge the .pte against its eager model (SNR within the runtime's rounding, top-1) before keeping it",
    )
    parser.add_argument("--generate", metavar="PROMPT", help="continue raw text from the .pte in ExecuTorch's runtime")
    parser.add_argument(
        "--chat", metavar="MESSAGE", help="answer a message through the checkpoint's chat template and TextLLMRunner"
    )
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("-v", "--verbose", action="store_true", help="show the dependencies' own logs too")
    return parser


def lowering_options(args: argparse.Namespace) -> dict[str, Any]:
    """``llm.lower_decoder`` keywords from the command line (:data:`LOWERING_OPTIONS`)."""
    return {flag.lstrip("-").replace("-", "_"): getattr(args, flag.lstrip("-").replace("-", "_")) for flag in LOWERING_OPTIONS}


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the command; returns the exit status (errors print one line naming what and the fix)."""
    return run_command(build_parser, run, argv, prog)


# ---------------------------------------------------------------- before any export work


@dataclass
class Plan:
    """What the command will do, settled from its input before anything is loaded or exported."""

    args: argparse.Namespace
    shapes: Any  # llm.DecoderShapes
    config: Any
    tokenizer: Any  # llm.tokenizer.Tokenizer or None
    chat_prompt: str | None

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.args.dtype]


def run(args: argparse.Namespace) -> None:
    from coreai_partitioner.llm import UnsupportedConfig, UnsupportedModel, UnsupportedShapes
    from coreai_partitioner.verify import fidelity
    from coreai_partitioner.decoder.tokenizer import TokenizerError

    try:
        plan = settle(args)
        if args.dry_run:
            dry_run(plan)
            return
        args.out.parent.mkdir(parents=True, exist_ok=True)
        partial = args.out.with_name(args.out.name + ".partial")
        try:
            written = export(plan, partial)
        finally:
            partial.unlink(missing_ok=True)
    except (UnsupportedModel, UnsupportedConfig, UnsupportedShapes, TokenizerError, fidelity.UnknownPrecision) as error:
        raise CommandError(str(error)) from None
    if args.generate is not None:
        generate(args.out, written, args.generate, plan.shapes, args.new_tokens)
    if args.chat is not None:
        chat(args.out, written, args.chat, plan.chat_prompt, args.new_tokens, args.checkpoint)


def settle(args: argparse.Namespace) -> Plan:
    """Every check that needs no weights: shapes, family, config, tokenizer, chat template."""
    from coreai_partitioner.llm import DecoderShapes

    try:
        shapes = DecoderShapes(args.max_context_len, args.prefill_chunk, args.shapes, args.target, args.device_shapes)
    except ValueError as error:
        raise CommandError(str(error)) from None
    if args.num_layers is not None and args.num_layers < 1:
        raise CommandError(f"--num-layers {args.num_layers}: give at least 1")
    if args.new_tokens < 1:
        raise CommandError(f"--new-tokens {args.new_tokens}: give at least 1")
    config = model_config(args)
    found = choose_tokenizer(args)
    for flag in ("generate", "chat"):
        if getattr(args, flag) is not None and args.checkpoint and found is None:
            raise CommandError(f"--{flag} needs a tokenizer, and this export has none")
    prompt = chat_prompt(args) if args.chat is not None else None
    return Plan(args, shapes, config, found, prompt)


def model_config(args: argparse.Namespace):
    """The config to export (its first ``--num-layers`` layers), refused up front if no family adapts it."""
    from transformers import AutoConfig

    from coreai_partitioner.llm import family_of, first_layers, tiny_config

    if args.checkpoint:
        if not (args.checkpoint / "config.json").is_file():
            what = "no such directory" if not args.checkpoint.is_dir() else "no config.json in it"
            raise CommandError(f"--checkpoint {args.checkpoint}: {what}; give a local Hugging Face checkpoint directory")
        config = AutoConfig.from_pretrained(args.checkpoint, local_files_only=True)
    else:
        config = tiny_config(args.config)
    family_of(config.get_text_config().model_type)  # refused here, before any work, if no family adapts it
    if args.num_layers is not None:
        try:
            config = first_layers(config, args.num_layers)
        except ValueError as error:
            raise CommandError(str(error)) from None
    return config


def choose_tokenizer(args: argparse.Namespace):
    """The checkpoint's tokenizer, checked as ExecuTorch's runner loads it, before any export work."""
    from coreai_partitioner.llm import tokenizer

    if not args.checkpoint or args.no_tokenizer:
        return None
    found = tokenizer.find(args.checkpoint)
    if found is None:
        warnings.warn(
            f"{args.checkpoint} has no tokenizer (tokenizer.json, tokenizer.model, *.tiktoken); the .pte is "
            "exported without one, and ExecuTorch's LLM runner will need one (--no-tokenizer says this is meant)",
            stacklevel=2,
        )
        return None
    return tokenizer.check(found)


def chat_prompt(args: argparse.Namespace) -> str:
    """``--chat``'s message in the checkpoint's chat template, as a deployer's app renders it for the runner."""
    if not args.checkpoint:
        raise CommandError("--chat needs a checkpoint with a chat template (--config models have none); use --generate")
    from transformers import AutoTokenizer

    try:
        with console.NativeStreams():
            hf_tokenizer = AutoTokenizer.from_pretrained(args.checkpoint, local_files_only=True)
    except (OSError, ValueError) as error:
        raise CommandError(f"--chat: transformers cannot load the tokenizer of {args.checkpoint} ({error}); use --generate") from None
    if not getattr(hf_tokenizer, "chat_template", None):
        raise CommandError(
            f"--chat: {args.checkpoint} has no chat template (chat_template.jinja, or chat_template in "
            "tokenizer_config.json); use --generate for raw text"
        )
    messages = [{"role": "user", "content": args.chat}]
    return hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def dry_run(plan: Plan) -> None:
    """What would be exported, from the config alone (the model is built on the meta device: no weights)."""
    from coreai_partitioner.llm import plan as decoder_plan

    args = plan.args
    print(decoder_plan(plan.config, plan.shapes, dtype=plan.dtype, full_logits=args.full_logits))
    found = plan.tokenizer
    print(f"  tokenizer: {found.describe() if found else 'one character per token (tiny config)' if not args.checkpoint else 'none'}")
    print(f"  would write {args.out}")


# ---------------------------------------------------------------- export


def load_model(args: argparse.Namespace, config, dtype: torch.dtype) -> torch.nn.Module:
    """The checkpoint at ``dtype``; or the tiny config's seeded model, made in fp32 and cast, so its fp32 twin
    (the verify reference) has the same weights."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    if not console.verbose():
        transformers_logging.disable_progress_bar()  # its "Loading weights" bar: the command has its own
    if args.checkpoint:
        return AutoModelForCausalLM.from_pretrained(
            args.checkpoint, config=config, dtype=dtype, local_files_only=True, attn_implementation="eager"
        ).eval()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager").eval()
    if dtype == torch.float32:
        return model
    cast = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="eager").eval()
    cast.load_state_dict(model.state_dict())
    return cast


def export(plan: Plan, partial: Path) -> Path | None:
    """Load, export, write ``partial``, verify it; then it becomes ``--out``, the tokenizer beside it."""
    from tqdm import tqdm

    from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte
    from coreai_partitioner.llm import byte_tokenizer, lower_decoder, tokenizer
    from coreai_partitioner.llm.check import eager_logits, reference

    args, shapes = plan.args, plan.shapes
    phases: dict[str, float] = {}
    verified = eager = None
    with tqdm(total=4 if args.verify else 3, unit="phase", leave=False) as bar:
        model = None
        if args.verify:
            bar.set_description("fp32 reference")
            start = time.perf_counter()
            model = load_model(args, plan.config, torch.float32)
            verified = reference(model, shapes, full_logits=args.full_logits)
            if plan.dtype != torch.float32:
                model = None  # the fp32 model goes before the one to export is loaded
            phases["fp32 reference"] = time.perf_counter() - start
            bar.update()
        bar.set_description("load model")
        start = time.perf_counter()
        if model is None:
            model = load_model(args, plan.config, plan.dtype)
        phases["load"] = time.perf_counter() - start
        bar.update()
        bar.set_description("export and lower")
        start = time.perf_counter()
        if verified is not None and plan.dtype != torch.float32 and not args.quantize:
            eager = eager_logits(model, verified, shapes)  # the model at its dtype: what the .pte must compute
        held: list | None = [] if verified is not None and args.quantize else None
        lowered = lower_decoder(model, shapes, quantized_reference=held, **lowering_options(args))
        if held:
            eager = eager_logits(held.pop(), verified, shapes)  # the quantized eager model
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
    logits = f"{'every position' if args.full_logits else 'last position'}'s logits"
    if shapes.device:
        for method, length in shapes.methods().items():
            print(f"  {method}: {len(pte.coreai_delegates(method))} CoreAIBackend delegate(s); "
                  + (f"T = {length}" if length else f"T bounded, 1 to {shapes.prefill_chunk}")
                  + f", context {shapes.max_context_len}, {logits}")
    else:
        print(f"  forward: {len(pte.coreai_delegates('forward'))} Core AI delegate; T {shapes.mode} up to "
              f"{shapes.prefill_chunk}, context {shapes.max_context_len}, {logits}")
    print(f"  .pte {pte.size:,} bytes, weights {weights:,} bytes ({pte.size / weights:.3f}x)")
    print("  seconds: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items()))
    if verified is not None:
        verify_pte(plan, partial, verified, eager)
    partial.replace(args.out)
    if plan.tokenizer is not None:
        written = tokenizer.copy(plan.tokenizer, args.out.parent)[0]
    elif not args.checkpoint:
        written = args.out.parent / "tokenizer.json"
        byte_tokenizer(text_config).save(str(written))
    else:
        written = None
    print(f"wrote {args.out}" + (f" and {written.name}" if written else " (no tokenizer)"))
    return written


def verify_pte(plan: Plan, pte: Path, verified, eager) -> None:
    """Print the .pte's report against its eager model (``eager``'s logits; the fp32 model's when ``None``) and the
    fp32 model; a .pte that falls short of its eager model is not kept."""
    from coreai_partitioner.llm.check import check

    start = time.perf_counter()
    with console.NativeStreams():
        report = check(pte, verified, plan.shapes, eager=eager, dtype=plan.dtype, quantize=plan.args.quantize)
    print(f"\n{report}\n  ({time.perf_counter() - start:.1f} s)")
    if not report.ok:
        raise CommandError(f"the .pte is not close enough to {report.against}; {plan.args.out} not written")


# ---------------------------------------------------------------- running the .pte


def generate(pte: Path, tokenizer_path: Path, prompt: str, shapes, new_tokens: int) -> None:
    """The .pte in ExecuTorch's runtime as its LLM runner calls it, the text as it comes, whole characters."""
    from coreai_partitioner.llm.text import generate_text

    print(f"\ngenerate: {prompt!r} -> ", end="", flush=True)
    result = generate_text(
        pte, tokenizer_path, prompt, shapes, max_new_tokens=new_tokens, on_text=lambda t: print(t, end="", flush=True)
    )
    print(
        f"\n  prompt {result.prompt_tokens} token(s) in {1000 * result.prompt_seconds:.0f} ms; "
        f"{result.generated_tokens} generated, {result.tokens_per_second:.1f} tokens/s"
    )


def chat(pte: Path, tokenizer_path: Path, message: str, prompt: str, new_tokens: int, checkpoint: Path) -> None:
    """``prompt`` (the chat template around ``message``) through ExecuTorch's ``TextLLMRunner``; the answer printed
    up to the end-of-turn token."""
    from transformers import AutoTokenizer

    from coreai_partitioner.llm.generate import eos_ids_of
    from coreai_partitioner.llm.runner import generate as runner_generate

    result = runner_generate(pte, tokenizer_path, prompt, max_new_tokens=new_tokens)
    with console.NativeStreams():
        hf_tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
        ends = [hf_tokenizer.decode([i]) for i in eos_ids_of(pte)]
    print(f"\nchat: {message!r} -> {answer(result.text, ends)}")
    print(
        f"  prompt {result.prompt_tokens} token(s) in {1000 * result.prompt_seconds:.0f} ms; "
        f"{result.generated_tokens} generated, {result.tokens_per_second:.1f} tokens/s (TextLLMRunner)"
    )


def answer(text: str, ends: list[str]) -> str:
    """``text`` up to the first end-of-turn piece the runner printed (it prints the EOS token too), stripped."""
    cut = min((text.find(end) for end in ends if end and end in text), default=len(text))
    return text[:cut].strip()
