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
(:mod:`coreai_partitioner.text_generation.check`).  ``--chat`` applies the checkpoint's
chat template to a message and answers it through ``TextLLMRunner``;
``--generate`` continues raw text.  ``--config`` builds a tiny random model
of any family (``coreai_partitioner.text_generation.supported()``) with a
one-character-per-token tokenizer.  Nothing is downloaded.  Needs the hf
extra: ``pip install 'coreai-partitioner[hf]'``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner import console
from coreai_partitioner.cli.command import CommandError
from coreai_partitioner.cli.detect import Detection, Head
from coreai_partitioner.cli.text_runs import add_generate_command, chat, generate  # noqa: F401 - the task's hooks
from coreai_partitioner.cli.task import Phases, Plan, at_dtype, describe_tokenizer, first_layers, partitioner_options, tokenizer_beside

NAME = "text-generation"
#: a tiny model per family, named by the model type the family adapts
DETECT = Detection(takes="a *ForCausalLM or an LLM family's model_type", heads=(Head("ForCausalLM"),), model_types=lambda: tiny_configs())
MODEL = "AutoModelForCausalLM"
RUNNER = "ExecuTorch's LLM runner"
FLAGS = ("--quantize", "--num-layers", "--max-context-len", "--prefill-chunk", "--no-tokenizer", "--generate", "--new-tokens")
DEFAULTS = {"config": "llama", "max_context_len": 128, "prefill_chunk": 32}

#: ``text_generation.lower_with_adapters`` keywords, by the flag whose ``dest`` each is.
LOWERING_OPTIONS = ("--full-logits", "--quantize", "--graph-breaks", "--kv-cache", "--attention-sink")
#: Under --quantize the weights it stores are read from the checkpoint as they are compressed (under --verify where the
#: fp32 model would not fit: cli/task.py's layer_by_layer).
STREAMS_WEIGHTS = True


def tiny_configs() -> list[str]:
    from coreai_partitioner.text_decoder import supported

    return list(supported())


def tiny_config(name: str) -> Any:
    from coreai_partitioner.text_decoder import tiny_config

    return tiny_config(name)


def add_flags(parser: argparse.ArgumentParser) -> None:
    from coreai_partitioner.text_decoder import DEVICE_SHAPES, SHAPE_MODES

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
        "--verify-len", type=int, metavar="V", help="the verify method's tokens (a draft of V - 1 and the token before "
        "it; docs/speculative.md): 9 by default where one fits (dynamic host shapes, the device form); 0: none")
    parser.add_argument(
        "--graph-breaks", type=int, metavar="N", help="device form: a Core AI delegate per N layers, each a function of the one asset"
    )
    parser.add_argument("--kv-cache", choices=("fp", "int8"), default="fp",
                        help="int8: KV caches stored int8 with a scale per token and head (docs/long-context.md)")
    parser.add_argument("--attention-sink", type=int, metavar="S", help="keep S sink tokens and a ring of "
                        "--max-context-len - S recent ones, generating past it (docs/long-context.md)")
    parser.add_argument(
        "--chat", metavar="MESSAGE", help="answer a message through the checkpoint's chat template and TextLLMRunner"
    )
    parser.add_argument(
        "--adapter",
        action="append",
        metavar="[NAME=]DIR",
        help="a PEFT LoRA adapter directory (repeatable): OUT.ptd holds the base weights once, OUT.pte is the base, "
        "NAME.pte each adapter over the same .ptd (NAME defaults to the directory's name)",
    )


def lowering_options(args: argparse.Namespace) -> dict[str, Any]:
    """``text_generation.lower_with_adapters`` keywords from the command line (:data:`LOWERING_OPTIONS`, and every task's partitioner
    options)."""
    own = {name: getattr(args, name) for name in (flag.lstrip("-").replace("-", "_") for flag in LOWERING_OPTIONS)}
    return {**own, **partitioner_options(args)}


def refusals() -> tuple[type[Exception], ...]:
    from coreai_partitioner.text_decoder import UnsupportedConfig, UnsupportedModel, UnsupportedShapes
    from coreai_partitioner.text_decoder.tokenizer import TokenizerError
    from coreai_partitioner.verify import fidelity

    from coreai_partitioner.blocks.sinks import UnsupportedSinks

    refused = (UnsupportedModel, UnsupportedConfig, UnsupportedShapes, TokenizerError, fidelity.UnknownPrecision,
               UnsupportedSinks)
    try:
        from coreai_partitioner.adapters.config import AdapterError
    except ImportError:  # PEFT is not installed: no adapter was asked for (settle says so otherwise)
        return refused
    return (*refused, AdapterError)


# ---------------------------------------------------------------- before any export work


@dataclass
class TextPlan(Plan):
    shapes: Any = None  # decoder.DecoderShapes
    chat_prompt: str | None = None  # --chat's message in the checkpoint's chat template
    adapters: list = field(default_factory=list)  # adapters.config.Adapter, read and checked against the config
    adapter_dirs: dict = field(default_factory=dict)  # name -> directory

    @property
    def streamable(self) -> bool:
        return not self.adapters  # PEFT wraps the checkpoint's layers


def settle(args: argparse.Namespace, config: Any) -> TextPlan:
    """Shapes, family (refused here if none adapts the config), chat template."""
    from coreai_partitioner.text_decoder import DecoderShapes, family_of

    try:
        verify = args.verify_len
        if verify is None and not (args.shapes == "dynamic" or args.target == "device"):
            verify = 0  # the default length where a verify method fits, none where it does not
        shapes = DecoderShapes(args.max_context_len, args.prefill_chunk, args.shapes, args.target, args.device_shapes, verify)
    except ValueError as error:
        raise CommandError(str(error)) from None
    family_of(config.get_text_config().model_type)  # refused here, before any work, if no family adapts it
    config = first_layers(config, args)
    prompt = chat_prompt(args) if args.chat is not None else None
    directories, adapters = read_adapters(args, config, shapes) if args.adapter else ({}, [])
    return TextPlan(args, config, shapes=shapes, chat_prompt=prompt, adapters=adapters, adapter_dirs=directories)


def read_adapters(args: argparse.Namespace, config: Any, shapes: Any) -> tuple[dict[str, Path], list]:
    """``--adapter``'s directories, each checked and read against the base's config (PEFT on the meta device)."""
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise CommandError("--adapter needs PEFT: pip install 'coreai-partitioner[adapters]'")
    from coreai_partitioner.adapters.config import parse_adapter_argument, read_adapter

    if not shapes.device and shapes.mode != "dynamic":
        raise CommandError("--adapter takes the host form's dynamic shapes (each adapter's rank is a dimension of "
                           "the program); leave out --shapes enumerated")
    directories = dict(parse_adapter_argument(text) for text in args.adapter)
    if len(directories) < len(args.adapter):
        raise CommandError("two --adapter flags give one name; name them apart with NAME=DIR")
    if args.out.stem in directories:
        raise CommandError(f"--adapter {args.out.stem}: the base is {args.out.name}; give the adapter another NAME=")
    base_name = args.checkpoint.resolve().name if args.checkpoint else None
    adapters = [read_adapter(name, path, config, base_name=base_name) for name, path in directories.items()]
    return directories, adapters


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
    from coreai_partitioner.text_generation import plan as decoder_plan

    print(decoder_plan(plan.config, plan.shapes, dtype=plan.dtype, full_logits=plan.args.full_logits))
    print(f"  tokenizer: {describe_tokenizer(plan)}")
    for adapter in plan.adapters:
        ranks = sorted({layer.rank for layer in adapter.layers.values()})
        print(f"  adapter {adapter.name}: {len(adapter.layers)} linear layer(s), rank {'/'.join(map(str, ranks))}, "
              f"{adapter.nbytes / 1e6:,.2f} MB of pairs (fp32), from {adapter.source}")
    data = plan.args.external_data or plan.adapters
    beside = [plan.args.out.with_suffix(".ptd").name] if data else []
    beside += [f"{name}.pte" for name in plan.adapter_dirs]
    print(f"  would write {plan.args.out}" + (f" and {', '.join(beside)}" if beside else ""))


# ---------------------------------------------------------------- export


def reference(plan: TextPlan, model: torch.nn.Module) -> dict[str | None, Any]:
    """The fp32 model's reference, by program: the base's (``None``) and each adapter's (PEFT's model, unmerged)."""
    from coreai_partitioner.text_generation.check import reference

    references = {}
    for name in (None, *plan.adapter_dirs):
        with peft_over(model, plan.adapter_dirs.get(name)) as eager_model:
            references[name] = reference(eager_model, plan.shapes, full_logits=plan.args.full_logits)
    return references


@contextmanager
def peft_over(model: torch.nn.Module, directory: Path | None) -> Iterator[torch.nn.Module]:
    """``model`` with the adapter in ``directory`` active, unmerged (PEFT's own model); ``model`` as it was after.
    No directory: ``model`` itself."""
    if directory is None:
        yield model
        return
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(model, directory).eval()
    try:
        yield peft_model
    finally:
        peft_model.unload()


def lower(plan: TextPlan, model: torch.nn.Module, phases: Phases) -> tuple[Any, Any]:
    """The decoder lowered, once for the base and every ``--adapter``; under ``--verify`` the eager model the programs
    were lowered from: the quantized eager model, or the model at its dtype (``None`` at fp32)."""
    from coreai_partitioner.text_generation.export import lower_with_adapters

    held: list | None = [] if plan.args.verify and plan.args.quantize else None
    with phases("export and lower"):
        lowered = lower_with_adapters(model, plan.shapes, plan.adapters, quantized_reference=held, **lowering_options(plan.args))
    if held:
        return lowered, held.pop()
    if plan.args.kv_cache != "fp":  # judged against the model's decoder over caches stored the same way (eager())
        return lowered, at_dtype(plan, model) or model
    return lowered, at_dtype(plan, model)


def eager(plan: TextPlan, lowered: Any, lowered_from: torch.nn.Module, verified: dict) -> dict:
    """Each program's eager logits: the quantized eager model with the program's pairs, its weights expanded once
    unless they would not fit expanded; or the model at its dtype, with the adapter active (PEFT's, unmerged)."""
    from coreai_partitioner.text_generation.adapters import WithPairs
    from coreai_partitioner.text_generation.check import eager_logits, stored_as

    logits = {}
    for name in (None, *plan.adapter_dirs):
        if plan.args.quantize:
            step = WithPairs(lowered_from, lowered.pairs(name)) if plan.adapters else lowered_from
            logits[name] = eager_logits(step, verified[name], plan.shapes, expanded=not plan.layer_by_layer)
            continue
        with peft_over(lowered_from, plan.adapter_dirs.get(name)) as eager_model:
            if plan.args.kv_cache != "fp":  # the program's own caches: the adapted decoder's, stored the same way
                eager_model = stored_as(eager_model, plan.shapes, plan.args.kv_cache, plan.args.full_logits)
            logits[name] = eager_logits(eager_model, verified[name], plan.shapes)
    return logits


def describe(plan: TextPlan, model: torch.nn.Module, pte: Any) -> None:
    shapes, text_config = plan.shapes, model.config.get_text_config()
    print(f"{type(model).__name__} ({text_config.model_type}): {text_config.num_hidden_layers} layer(s), {plan.args.dtype}")
    print(f"  methods: {', '.join(pte.methods)}")
    logits = f"{'every position' if plan.args.full_logits else 'last position'}'s logits"
    if shapes.device:
        for method, length in shapes.methods().items():
            if method != "verify":
                print(f"  {method}: {len(pte.coreai_delegates(method))} CoreAIBackend delegate(s); "
                      + (f"T = {length}" if length else f"T bounded, 1 to {shapes.prefill_chunk}")
                      + f", context {shapes.max_context_len}, {logits}")
    else:
        print(f"  forward: {len(pte.coreai_delegates('forward'))} Core AI delegate; T {shapes.mode} up to "
              f"{shapes.prefill_chunk}, context {shapes.max_context_len}, {logits}")
    if shapes.verify_tokens:
        print(f"  verify: T = {shapes.verify_tokens} (the last token and up to {shapes.verify_tokens - 1} drafts), "
              "every position's logits, over forward's caches (generate-text --speculate)")


def check(plan: TextPlan, path: Path, verified: Any, eager: Any) -> Any:
    """The base's ``.pte`` judged; with adapters, each program over the ``.ptd`` (:class:`ProgramReports`)."""
    from coreai_partitioner.text_generation.check import check
    from coreai_partitioner.verify import PteWithData, reset_state

    reports = {}
    for name in (None, *plan.adapter_dirs):
        pte = path.with_name(f"{name}.pte") if name else path
        program = PteWithData(pte, path.with_suffix(".ptd")) if plan.adapters else pte
        reset_state()
        reports[name or path.stem] = check(
            program, verified[name], plan.shapes, eager=(eager or {}).get(name), dtype=plan.dtype, quantize=plan.args.quantize
        )
    return ProgramReports(reports) if plan.adapters else reports[path.stem]


@dataclass
class ProgramReports:
    """``--verify``'s reports of the base and each adapter's program (against PEFT's model with it active)."""

    reports: dict[str, Any]

    @property
    def ok(self) -> bool:
        return all(report.ok for report in self.reports.values())

    @property
    def against(self) -> str:
        failed = [name for name, report in self.reports.items() if not report.ok] or list(self.reports)
        return ", ".join(f"{name}: {self.reports[name].against}" for name in failed)

    def __str__(self) -> str:
        return "\n\n".join(f"[{name}]\n{report}" for name, report in self.reports.items())


def companions(plan: TextPlan, directory: Path) -> list[Path]:
    """The tokenizer (its chat template with it), or a tiny model's one-character-per-token ``tokenizer.json``."""
    from coreai_partitioner.text_decoder import tokenizer
    from coreai_partitioner.text_generation import byte_tokenizer

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
    programs = {None: args.out, **{name: args.out.with_name(f"{name}.pte") for name in plan.adapter_dirs}}
    for name, pte in programs.items():
        if name is not None:  # an adapter's .pte runs over the base's .ptd
            from coreai_partitioner.verify import PteWithData

            pte = PteWithData(pte, args.out.with_suffix(".ptd"))
        label = f"[{name or args.out.stem}]" if plan.adapters else ""
        if args.generate is not None:
            from coreai_partitioner.blocks.sinks import POSITIONS  # sinks: generation goes on past the cache's length
            shapes = replace(plan.shapes, max_context_len=POSITIONS) if args.attention_sink else plan.shapes
            generate(pte, tokenizer, args.generate, shapes, args.new_tokens, label)
        if args.chat is not None:
            chat(pte, tokenizer, args.chat, plan.chat_prompt, args.new_tokens, args.checkpoint, label)
