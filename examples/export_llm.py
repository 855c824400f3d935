"""Export a Hugging Face decoder-only LLM (Llama, Qwen2, Qwen3, Mistral) to a .pte with Core AI composites.

    python examples/export_llm.py --config qwen3 --verify
    python examples/export_llm.py --checkpoint path/to/local/hf/checkpoint --dtype fp16 --out model.pte

The .pte has two methods: ``prefill`` (a forward over the prompt, no cache) and
``decode`` (one token over a static KV cache held in buffers the Core AI
delegate takes over).  RMSNorm, attention and RoPE run as Core AI composites.
Models come from a tiny built-in config with random weights unless
``--checkpoint`` names a local checkpoint directory (nothing is downloaded).
Needs the hf extra: ``pip install -e '.[hf]'``.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message="coreai-torch has only been validated")

import torch  # noqa: E402
from coreai_torch import get_decomp_table  # noqa: E402
from executorch.exir import to_edge_transform_and_lower  # noqa: E402
from tqdm import tqdm  # noqa: E402

from coreai_partitioner import (  # noqa: E402
    CoreAIPartitioner,
    default_specs,
    externalize_modules,
    get_default_compile_config,
    get_default_passes,
    hf,
    verify,
)
from coreai_partitioner.assets import asset_ir, summarize_ir  # noqa: E402
from coreai_partitioner.pte import read_pte  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def load_model(args: argparse.Namespace) -> torch.nn.Module:
    if args.checkpoint:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(
            args.checkpoint, torch_dtype=DTYPES[args.dtype], local_files_only=True
        ).eval()
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(hf.tiny_config(args.config)).to(DTYPES[args.dtype]).eval()


def quantize_int8(model: torch.nn.Module) -> None:
    """Weight-only int8 with coremltools' PostTrainingQuantizer, in place."""
    from coremltools.optimize.torch.quantization import PostTrainingQuantizer, PostTrainingQuantizerConfig

    config = PostTrainingQuantizerConfig.from_dict(
        {"global_config": {"weight_dtype": "int8", "granularity": "per_channel"}}
    )
    PostTrainingQuantizer(model, config).compress(inplace=True)


def export_llm(model: torch.nn.Module, args: argparse.Namespace, phases: dict, bar: tqdm):
    """Externalize and lower prefill and decode; returns the lowered program."""
    prompt = torch.zeros(1, args.prefill_len, dtype=torch.long)
    step = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    quantized = []

    def export(module: torch.nn.Module, sample: tuple) -> torch.export.ExportedProgram:
        if args.quantize == "int8" and not quantized:
            quantize_int8(model)  # after coreai-torch patched the composites, before export
            quantized.append(True)
        with torch.no_grad():
            return torch.export.export(module, sample).run_decompositions(get_decomp_table())

    programs, records = {}, {}
    with hf.coreai_composites(model) as swaps:
        bar.write(f"swapped: {swaps}")
        for name, module, sample in (
            ("prefill", hf.PrefillProgram(model), (prompt,)),
            ("decode", hf.StaticCacheDecoder(model, args.max_seq_len), step),
        ):
            bar.set_description(f"externalize {name}")
            start = time.perf_counter()
            programs[name], records[name] = externalize_modules(
                module.eval(), default_specs(), export_fn=lambda m, sample=sample: export(m, sample)
            )
            phases[f"externalize {name}"] = time.perf_counter() - start
            bar.update()
    bar.set_description("lower")
    start = time.perf_counter()
    lowered = to_edge_transform_and_lower(
        programs,
        partitioner={name: [CoreAIPartitioner(externalized_modules=r)] for name, r in records.items()},
        compile_config=get_default_compile_config(),
        transform_passes=get_default_passes(),
    )
    phases["lower"] = time.perf_counter() - start
    bar.update()
    return lowered


def summarize(model: torch.nn.Module, path: Path, phases: dict) -> None:
    pte = read_pte(path)
    print(f"\n{type(model).__name__}: {model.config.num_hidden_layers} layer(s), {model.dtype} -> {path}")
    with tempfile.TemporaryDirectory() as directory:
        for method in pte.methods:
            delegates = [d for d in pte.delegates if d.method == method]
            composites: Counter[str] = Counter()
            for delegate in delegates:
                composites.update(summarize_ir(asset_ir(delegate.asset_path(directory))).composites())
            listed = ", ".join(f"{n} x{c}" for n, c in sorted(composites.items()))
            print(f"  {method}: {len(delegates)} Core AI delegate(s); composites: {listed}")
    print(f"  .pte size: {pte.size:,} bytes")
    print("  seconds: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items()))


def check(model: torch.nn.Module, lowered, args: argparse.Namespace) -> bool:
    """Prefill logits and an 8-token greedy decode against HF eager (the original modules)."""
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prefill_len), generator=generator)
    with torch.no_grad():
        expected = model(prompt).logits
    report = verify.check(lowered, expected, prompt, method="prefill")
    print(f"\nprefill vs Hugging Face eager:\n{report}")
    tokens = prompt[0, :4].tolist()
    got = hf.greedy_decode(lowered, tokens, 8)
    with torch.no_grad():
        wanted = model.generate(torch.tensor([tokens]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0].tolist()
    print(f"\ngreedy decode, 8 tokens:\n  Core AI : {got}\n  HF eager: {wanted}\n  {'same' if got == wanted else 'DIFFERENT'}")
    return report.ok and got == wanted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", choices=("llama", "qwen2", "qwen3"), default="llama")
    source.add_argument("--checkpoint", type=Path, help="a local Hugging Face checkpoint directory")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--max-seq-len", type=int, default=64, help="static KV cache length of decode")
    parser.add_argument("--prefill-len", type=int, default=16, help="prompt length of prefill")
    parser.add_argument("--quantize", choices=("int8",), help="weight-only quantization")
    parser.add_argument("--out", type=Path, default=Path("model.pte"))
    parser.add_argument("--verify", action="store_true", help="check against HF eager on the Core AI runtime")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    phases: dict[str, float] = {}
    with tqdm(total=5 if args.verify else 4, unit="phase") as bar:
        bar.set_description("load model")
        start = time.perf_counter()
        model = load_model(args)
        phases["load"] = time.perf_counter() - start
        lowered = export_llm(model, args, phases, bar)
        bar.set_description("serialize")
        start = time.perf_counter()
        with open(args.out, "wb") as file:
            lowered.to_executorch().write_to_file(file)
        phases["serialize"] = time.perf_counter() - start
        bar.update()
        ok = True
        if args.verify:
            bar.set_description("verify")
            start = time.perf_counter()
            ok = check(model, lowered, args)
            phases["verify"] = time.perf_counter() - start
            bar.update()
    summarize(model, args.out, phases)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
