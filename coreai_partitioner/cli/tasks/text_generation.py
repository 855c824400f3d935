"""Export a Hugging Face decoder-only LLM to a .pte for ExecuTorch's LLM runner, with Core AI composites.

    python -m coreai_partitioner export-llm --config qwen3 --verify --generate "Hello"
    python -m coreai_partitioner export-llm --checkpoint path/to/checkpoint --dtype fp16 --verify --out out/model.pte
    python -m coreai_partitioner export-llm --checkpoint path/to/checkpoint --chat "What is the capital of France?"
    python -m coreai_partitioner export-llm --checkpoint path/to/checkpoint --num-layers 2 --dry-run
    python -m coreai_partitioner export-llm --config gemma3_text --shapes enumerated     # static shapes, for the Neural Engine

(``python -m coreai_partitioner export`` picks this task for a causal LM's
checkpoint; ``coreai-export-llm`` and ``examples/export_llm.py`` are this
task too.)  The .pte has one method, ``forward(tokens [1, T], input_pos [T])
-> logits`` (the last position's, ``[1, 1, vocab]``; every position's with
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner import console
from coreai_partitioner.cli.command import CommandError
from coreai_partitioner.cli.detect import Detection, Head
from coreai_partitioner.cli.task import Phases, Plan, describe_tokenizer, first_layers, tokenizer_beside

NAME = "text-generation"
#: a tiny model per family, named by the model type the family adapts
DETECT = Detection(takes="a *ForCausalLM or an LLM family's model_type", heads=(Head("ForCausalLM"),), model_types=lambda: tiny_configs())
MODEL = "AutoModelForCausalLM"
RUNNER = "ExecuTorch's LLM runner"
FLAGS = ("--quantize", "--num-layers", "--max-context-len", "--prefill-chunk", "--no-tokenizer", "--generate", "--new-tokens")
DEFAULTS = {"config": "llama", "max_context_len": 128, "prefill_chunk": 32}

#: ``llm.lower_decoder`` keywords, by the flag whose ``dest`` each is.
LOWERING_OPTIONS = ("--full-logits", "--quantize", "--graph-breaks", "--debug-info")


def tiny_configs() -> list[str]:
    from coreai_partitioner.decoder import supported

    return list(supported())


def tiny_config(name: str) -> Any:
    from coreai_partitioner.decoder import tiny_config

    return tiny_config(name)


def add_flags(parser: argparse.ArgumentParser) -> None:
    from coreai_partitioner.decoder import DEVICE_SHAPES, SHAPE_MODES

    parser.add_argument("--shapes", choices=SHAPE_MODES, default="dynamic", help="the host form's shapes")
    parser.add_argument(
        "--device-shapes",
        choices=DEVICE_SHAPES,
        default="bounded",
        help="the device form's layout: bounded = one forward taking T from 1 to --prefill-chunk (TextLLMRunner "
        "prefills in chunks); static = forward T=1 beside prefill T=chunk (fixed shapes; TextLLMRunner feeds "
        "the prompt token by token)",
    )
    parser.add_argument("--full-logits", action="store_true", help="forward returns every position's logits")
    parser.add_argument(
        "--graph-breaks", type=int, metavar="N", help="device form: a Core AI delegate per N layers, each a function of the one asset"
    )
    parser.add_argument(
        "--chat", metavar="MESSAGE", help="answer a message through the checkpoint's chat template and TextLLMRunner"
    )


def lowering_options(args: argparse.Namespace) -> dict[str, Any]:
    """``llm.lower_decoder`` keywords from the command line (:data:`LOWERING_OPTIONS`)."""
    return {name: getattr(args, name) for name in (flag.lstrip("-").replace("-", "_") for flag in LOWERING_OPTIONS)}


def refusals() -> tuple[type[Exception], ...]:
    from coreai_partitioner.decoder import UnsupportedConfig, UnsupportedModel, UnsupportedShapes
    from coreai_partitioner.decoder.tokenizer import TokenizerError
    from coreai_partitioner.verify import fidelity

    return UnsupportedModel, UnsupportedConfig, UnsupportedShapes, TokenizerError, fidelity.UnknownPrecision


# ---------------------------------------------------------------- before any export work


@dataclass
class TextPlan(Plan):
    shapes: Any = None  # decoder.DecoderShapes
    chat_prompt: str | None = None  # --chat's message in the checkpoint's chat template


def settle(args: argparse.Namespace, config: Any) -> TextPlan:
    """Shapes, family (refused here if none adapts the config), chat template."""
    from coreai_partitioner.decoder import DecoderShapes, family_of

    try:
        shapes = DecoderShapes(args.max_context_len, args.prefill_chunk, args.shapes, args.target, args.device_shapes)
    except ValueError as error:
        raise CommandError(str(error)) from None
    family_of(config.get_text_config().model_type)  # refused here, before any work, if no family adapts it
    config = first_layers(config, args)
    prompt = chat_prompt(args) if args.chat is not None else None
    return TextPlan(args, config, shapes=shapes, chat_prompt=prompt)


def chat_prompt(args: argparse.Namespace) -> str:
    """``--chat``'s message in the checkpoint's chat template, as a deployer's app renders it for the runner."""
    if not args.checkpoint:
        raise CommandError("--chat needs a checkpoint with a chat template (--config models have none); use --generate")
    if args.no_tokenizer:
        raise CommandError("--chat needs the checkpoint's tokenizer beside the .pte; leave out --no-tokenizer")
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


def dry_run(plan: TextPlan) -> None:
    """What would be exported, from the config alone (the model is built on the meta device: no weights)."""
    from coreai_partitioner.llm import plan as decoder_plan

    print(decoder_plan(plan.config, plan.shapes, dtype=plan.dtype, full_logits=plan.args.full_logits))
    print(f"  tokenizer: {describe_tokenizer(plan)}")
    print(f"  would write {plan.args.out}")


# ---------------------------------------------------------------- export


def reference(plan: TextPlan, model: torch.nn.Module) -> Any:
    from coreai_partitioner.llm.check import reference

    return reference(model, plan.shapes, full_logits=plan.args.full_logits)


def lower(plan: TextPlan, model: torch.nn.Module, verified: Any, phases: Phases) -> tuple[Any, Any]:
    """The decoder lowered; under ``--verify`` the logits of the eager model it was lowered from (the model at its
    dtype, or the quantized eager model), ``None`` at fp32."""
    from coreai_partitioner.llm import lower_decoder
    from coreai_partitioner.llm.check import eager_logits

    eager = None
    with phases("export and lower"):
        if verified is not None and plan.dtype != torch.float32 and not plan.args.quantize:
            eager = eager_logits(model, verified, plan.shapes)  # the model at its dtype: what the .pte must compute
        held: list | None = [] if verified is not None and plan.args.quantize else None
        lowered = lower_decoder(model, plan.shapes, quantized_reference=held, **lowering_options(plan.args))
        if held:
            eager = eager_logits(held.pop(), verified, plan.shapes)  # the quantized eager model
    return lowered, eager


def describe(plan: TextPlan, model: torch.nn.Module, pte: Any) -> None:
    shapes, text_config = plan.shapes, model.config.get_text_config()
    print(f"{type(model).__name__} ({text_config.model_type}): {text_config.num_hidden_layers} layer(s), {plan.args.dtype}")
    print(f"  methods: {', '.join(pte.methods)}")
    logits = f"{'every position' if plan.args.full_logits else 'last position'}'s logits"
    if shapes.device:
        for method, length in shapes.methods().items():
            print(f"  {method}: {len(pte.coreai_delegates(method))} CoreAIBackend delegate(s); "
                  + (f"T = {length}" if length else f"T bounded, 1 to {shapes.prefill_chunk}")
                  + f", context {shapes.max_context_len}, {logits}")
    else:
        print(f"  forward: {len(pte.coreai_delegates('forward'))} Core AI delegate; T {shapes.mode} up to "
              f"{shapes.prefill_chunk}, context {shapes.max_context_len}, {logits}")


def check(plan: TextPlan, path: Path, verified: Any, eager: Any) -> Any:
    from coreai_partitioner.llm.check import check

    return check(path, verified, plan.shapes, eager=eager, dtype=plan.dtype, quantize=plan.args.quantize)


def companions(plan: TextPlan, directory: Path) -> list[Path]:
    """The tokenizer (its chat template with it), or a tiny model's one-character-per-token ``tokenizer.json``."""
    from coreai_partitioner.decoder import tokenizer
    from coreai_partitioner.llm import byte_tokenizer

    if plan.tokenizer is not None:
        return tokenizer.copy(plan.tokenizer, directory)
    if plan.args.checkpoint:
        return []
    written = directory / "tokenizer.json"
    byte_tokenizer(plan.config.get_text_config()).save(str(written))
    return [written]


# ---------------------------------------------------------------- running the .pte


def after(plan: TextPlan) -> None:
    args = plan.args
    tokenizer = tokenizer_beside(plan)
    if args.generate is not None:
        generate(args.out, tokenizer, args.generate, plan.shapes, args.new_tokens)
    if args.chat is not None:
        chat(args.out, tokenizer, args.chat, plan.chat_prompt, args.new_tokens, args.checkpoint)


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
