"""Export a Hugging Face T5 or Flan-T5 checkpoint to a .pte whose methods are speech recognition's: encoder and text_decoder.

    python -m coreai_partitioner export --checkpoint path/to/flan-t5 --out out/model.pte --verify --generate "translate English to German: Hello"
    python -m coreai_partitioner export --checkpoint path/to/t5 --target device --dtype fp16 --max-input-len 128
    python -m coreai_partitioner export --config flan-t5 --verify          # a tiny random Flan-T5 (t5: the original T5's shape)

The .pte has the methods of ExecuTorch's ASR runner and optimum-executorch's
``ExecuTorchModelForSeq2SeqLM``: ``encoder(input_ids [1, T] int64)``, ``T``
from 1 to ``--max-input-len``, whose one output is the input's
cross-attention keys and values, and ``text_decoder(ids [1, 1] int64,
encoder output, cache_position [1] int64) -> logits [1, 1, vocab]``, one
token a call over static self-attention caches of ``--max-context-len``
slots; both Core AI delegates, functions of one asset, plus constant methods
(``decoder_start_token_id``, ``get_eos_ids``, ``get_max_seq_len``,
``max_hidden_seq_length``).  Attention is the SDPA composite with T5's
relative position bias added through it, norms the ``rms_norm`` composite.
Beside it: the tokenizer (``spiece.model``, which ExecuTorch's runner
tokenizers read as SentencePiece; T5's ``tokenizer.json`` is a Unigram model
their Hugging Face loader does not read, copied for Python) and
``generation_config.json``.  ``--target device`` is the form upstream's
on-device Core AI runtime runs (``CoreAIBackend``, fp16/fp32 tensors only,
caches owned by ExecuTorch).  ``--verify`` judges the encoder's output, the
logits and the greedy ids against the Hugging Face model before keeping the
.pte; ``--generate`` answers a prompt through ExecuTorch's runtime.  Nothing
is downloaded.  Needs the hf extra.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreai_partitioner import console
from coreai_partitioner.cli.detect import Detection, Head
from coreai_partitioner.cli.task import (
    Phases, Plan, at_dtype, checkpoint_generation, copy_beside, describe_encoder_decoder, describe_tokenizer, partitioner_options,
)

NAME = "text2text-generation"
DETECT = Detection(
    takes="T5 and Flan-T5, a T5ForConditionalGeneration",
    heads=(Head("ForConditionalGeneration", model_type="t5", absent="vision_config"),),
    model_types=("t5",),
)
MODEL = "AutoModelForSeq2SeqLM"
RUNNER = "optimum-executorch's ExecuTorchModelForSeq2SeqLM (and --generate)"
FLAGS = ("--max-input-len", "--max-context-len", "--generate", "--new-tokens")
DEFAULTS = {"config": "flan-t5"}

#: ``--verify``'s input when there is no ``--generate`` prompt, and how many tokens it decodes.
VERIFY_PROMPT = "translate English to German: The house is wonderful."
VERIFY_TOKENS = 16


def tiny_configs() -> list[str]:
    from coreai_partitioner.text2text.tiny import FEED_FORWARD

    return list(FEED_FORWARD)


def tiny_config(name: str) -> Any:
    from coreai_partitioner.text2text.tiny import tiny_config

    return tiny_config(name)


def tiny_model(config: Any) -> Any:
    """The tiny random model of ``config``: Hugging Face's init, its MLPs scaled so its greedy tokens vary
    (:func:`~coreai_partitioner.text2text.tiny.random_model`)."""
    from coreai_partitioner.text2text.tiny import random_model

    return random_model(config)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """None of its own: the shared --max-input-len (default the model's ``n_positions``, 512) bounds the input,
    --max-context-len the cache."""


def refusals() -> tuple[type[Exception], ...]:
    from coreai_partitioner.blocks.errors import UnsupportedConfig
    from coreai_partitioner.text_decoder.tokenizer import TokenizerError
    from coreai_partitioner.text2text import UnsupportedText2TextModel

    return UnsupportedText2TextModel, UnsupportedConfig, TokenizerError


# ---------------------------------------------------------------- before any export work


@dataclass
class Text2TextPlan(Plan):
    decoding: Any = None  # transformers.GenerationConfig: what the model carries, and written beside the .pte
    max_input_len: int = 0
    max_decode_len: int = 0

    @property
    def generation(self) -> Any:
        return self.decoding


def settle(args: argparse.Namespace, config: Any) -> Text2TextPlan:
    """The checkpoint's task (refused before any work: ``task_of`` takes a T5's config only), the input and cache
    lengths."""
    from coreai_partitioner.text2text.t5 import positions_of

    generation = generation_config(args, config)
    return Text2TextPlan(
        args, config, decoding=generation, max_input_len=args.max_input_len or positions_of(config),
        max_decode_len=args.max_context_len or positions_of(config),
    )


def generation_config(args: argparse.Namespace, config: Any) -> Any:
    """The generation config to export, the config refused up front if it is not a text2text model's."""
    from coreai_partitioner.text2text.tiny import tiny_generation_config

    if not args.checkpoint:
        return tiny_generation_config(config)
    return checkpoint_generation(args.checkpoint, config)


def dry_run(plan: Text2TextPlan) -> None:
    """What would be exported, from the config alone."""
    config, args = plan.config, plan.args
    print(f"{config.model_type} ({config.feed_forward_proj}): {config.num_layers} + {config.num_decoder_layers} layers, "
          f"{args.dtype}, {args.target} form")
    print(f"  encoder(input_ids [1, T], T from 1 to {plan.max_input_len}) -> cross-attention keys and values")
    print(f"  text_decoder(ids [1, 1], cross, cache_position [1]) -> logits [1, 1, {config.vocab_size}]; "
          f"{plan.max_decode_len} cache slots")
    print(f"  tokenizer: {describe_tokenizer(plan)}")
    print(f"  would write {args.out}")


# ---------------------------------------------------------------- export


def input_ids(plan: Text2TextPlan) -> torch.Tensor:
    """``--verify``'s input: ``--generate``'s prompt, or a translation prompt, through the checkpoint's tokenizer (a
    tiny model's one character per token), cut to ``--max-input-len``."""
    prompt = plan.args.generate if plan.args.generate is not None else VERIFY_PROMPT
    return torch.tensor([tokenize(plan, prompt)[: plan.max_input_len]])


def tokenize(plan: Text2TextPlan, text: str) -> list[int]:
    """``text``'s ids as the model's tokenizer gives them (``</s>`` last)."""
    if not plan.args.checkpoint:
        from coreai_partitioner.text2text.tiny import tiny_tokenizer

        return tiny_tokenizer().encode(text).ids
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(plan.args.checkpoint, local_files_only=True)(text).input_ids


def reference(plan: Text2TextPlan, model: torch.nn.Module) -> Any:
    from coreai_partitioner.text2text.check import reference

    return reference(model, input_ids(plan), max_new_tokens=VERIFY_TOKENS)


def lower(plan: Text2TextPlan, model: torch.nn.Module, phases: Phases) -> tuple[Any, Any]:
    """Both methods lowered at ``--dtype``; under ``--verify`` and fp16, Hugging Face's model at it, the ``.pte``'s
    judge (``None`` at fp32: the reference's).  At fp16 the whole model is fp16, the MLP's output projection too
    (Hugging Face keeps it fp32 when it loads a checkpoint in fp16)."""
    from coreai_partitioner.text2text import adapt, lower_text2text

    if plan.dtype != torch.float32:
        with phases("cast"):
            model = model.to(plan.dtype)
    text2text = adapt(model, plan.max_decode_len, plan.max_input_len)
    lowered = lower_text2text(
        model, target=plan.args.target, text2text=text2text, phases=phases.seconds, **partitioner_options(plan.args)
    )
    return lowered, at_dtype(plan, model)


def eager(plan: Text2TextPlan, lowered: Any, lowered_from: torch.nn.Module, verified: Any) -> Any:
    """Hugging Face's outputs at ``--dtype``: the reference's steps on the model the ``.pte`` is lowered from."""
    return reference(plan, lowered_from)


def describe(plan: Text2TextPlan, model: torch.nn.Module, pte: Any) -> None:
    config = model.config
    print(f"{type(model).__name__} ({config.model_type}, {config.feed_forward_proj}): {config.num_layers} + "
          f"{config.num_decoder_layers} layers, {plan.args.dtype}, {plan.args.target} form")
    describe_encoder_decoder(pte, f"input_ids [1, T], T from 1 to {plan.max_input_len}", config.vocab_size, plan.max_decode_len)


def check(plan: Text2TextPlan, path: Path, verified: Any, eager: Any) -> Any:
    from coreai_partitioner.seq2seq.check import check
    from coreai_partitioner.text2text import Text2TextProgram

    return check(Text2TextProgram(path), verified, eager=eager if eager is not None else verified, dtype=plan.dtype,
                 max_new_tokens=VERIFY_TOKENS)


def companions(plan: Text2TextPlan, directory: Path) -> list[Path]:
    """The tokenizer the runner reads (``spiece.model``) with its companions and T5's ``tokenizer.json``, or a tiny
    model's one-character-per-token ``tokenizer.json``; ``generation_config.json``."""
    from coreai_partitioner.text_decoder import tokenizer
    from coreai_partitioner.text2text.tiny import tiny_tokenizer

    if plan.tokenizer is not None:
        written = tokenizer.copy(plan.tokenizer, directory)
        python_tokenizer = plan.args.checkpoint / "tokenizer.json"
        if python_tokenizer.is_file() and directory / "tokenizer.json" not in written:
            written.append(copy_beside(python_tokenizer, directory))
    else:
        written = [directory / "tokenizer.json"]
        tiny_tokenizer().save(str(written[0]))
    plan.decoding.save_pretrained(directory)
    written.append(directory / "generation_config.json")
    return written


# ---------------------------------------------------------------- running the .pte


def after(plan: Text2TextPlan) -> None:
    """``--generate``: the prompt through the written .pte in ExecuTorch's runtime, the answer printed."""
    from coreai_partitioner.text2text import Text2TextProgram

    args = plan.args
    if args.generate is None:
        return
    with console.NativeStreams():
        program = Text2TextProgram(args.out)
        text, decoded = program.answer(args.generate, max_new_tokens=args.new_tokens)
    print(f"\ngenerate: {args.generate!r} -> {text!r}")
    print(f"  encoder {1000 * decoded.encoder_seconds:.0f} ms; {len(decoded.ids)} token(s), "
          f"{1000 * decoded.seconds_per_token:.0f} ms per text_decoder call")
