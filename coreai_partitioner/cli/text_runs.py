"""Running a text-generation ``.pte`` from the command line: export's ``--generate`` and ``--chat`` (what the
text-generation task runs after its export), and ``generate-text`` (greedy or speculative decoding over its
``verify`` method, docs/speculative.md), the text-generation task's generate command."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from coreai_partitioner import console


def generate(pte: Path, tokenizer_path: Path, prompt: str, shapes, new_tokens: int, label: str = "") -> None:
    """The .pte in ExecuTorch's runtime as its LLM runner calls it, the text as it comes, whole characters."""
    from coreai_partitioner.text_generation.text import generate_text

    print(f"\ngenerate{label}: {prompt!r} -> ", end="", flush=True)
    result = generate_text(
        pte, tokenizer_path, prompt, shapes, max_new_tokens=new_tokens, on_text=lambda t: print(t, end="", flush=True)
    )
    print(
        f"\n  prompt {result.prompt_tokens} token(s) in {1000 * result.prompt_seconds:.0f} ms; "
        f"{result.generated_tokens} generated, {result.tokens_per_second:.1f} tokens/s"
    )


def chat(pte: Path, tokenizer_path: Path, message: str, prompt: str, new_tokens: int, checkpoint: Path, label: str = "") -> None:
    """``prompt`` (the chat template around ``message``) through ExecuTorch's ``TextLLMRunner``; the answer printed
    up to the end-of-turn token."""
    from transformers import AutoTokenizer

    from coreai_partitioner.text_generation.generate import eos_ids_of
    from coreai_partitioner.text_generation.runner import generate as runner_generate

    result = runner_generate(pte, tokenizer_path, prompt, max_new_tokens=new_tokens)
    with console.NativeStreams():
        hf_tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
        ends = [hf_tokenizer.decode([i]) for i in eos_ids_of(pte)]
    print(f"\nchat{label}: {message!r} -> {answer(result.text, ends)}")
    print(
        f"  prompt {result.prompt_tokens} token(s) in {1000 * result.prompt_seconds:.0f} ms; "
        f"{result.generated_tokens} generated, {result.tokens_per_second:.1f} tokens/s (TextLLMRunner)"
    )


def answer(text: str, ends: list[str]) -> str:
    """``text`` up to the first end-of-turn piece the runner printed (it prints the EOS token too), stripped."""
    cut = min((text.find(end) for end in ends if end and end in text), default=len(text))
    return text[:cut].strip()


def add_generate_command(commands: Any) -> None:
    """``generate-text PTE --tokenizer DIR --prompt TEXT``: greedy, or ``--speculate`` (docs/speculative.md)."""
    parser = commands.add_parser("generate-text", help="a text-generation .pte's text in ExecuTorch's runtime, greedily")
    parser.add_argument("pte", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True, help="the checkpoint (tokenizer, chat template) or a file")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--data-path", type=Path, help="the .pte's .ptd (default: the one of its name beside it)")
    parser.add_argument("--speculate", metavar="prompt-lookup|lookahead|draft:DRAFT.pte", help="draft, then verify")
    parser.add_argument("--draft-len", type=int, help="drafts a verify call takes (default: get_max_draft_len)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; sampling is refused with --speculate")
    parser.add_argument("--raw", action="store_true", help="the prompt as it is, not in the chat template")
    parser.add_argument("--stats-json", type=Path, help="write {tokens, target_calls, draft_calls, accepted} here")
    parser.set_defaults(run=generate_text_command)


def generate_text_command(args: argparse.Namespace) -> int:
    """The text on standard output as it comes; 2 for a .pte, tokenizer or flag it refuses."""
    import json
    import sys

    from coreai_partitioner import verify
    from coreai_partitioner.text_generation.speculative import SpeculationError, check_sampling, generate

    try:
        check_sampling(args.temperature, args.speculate, greedy_only=True)
        with console.NativeStreams():  # the Core AI runtime's own lines as it loads each function
            _, stats = generate(args.pte, args.tokenizer, args.prompt, max_new_tokens=args.max_new_tokens,
                                speculate=args.speculate, draft_len=args.draft_len, data_path=args.data_path,
                                raw=args.raw, on_text=lambda text: print(text, end="", flush=True))
    except (SpeculationError, verify.UnsupportedProgram, ValueError) as error:
        print(f"generate-text: {error}", file=sys.stderr)
        return 2
    print()
    if args.stats_json is not None:
        args.stats_json.write_text(json.dumps(stats.as_json()) + "\n")
    return 0
