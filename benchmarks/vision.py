"""Vision-language export at a real model's shape: export time per phase, peak RSS, .pte size, vision-encoder and prefill time.

    python benchmarks/vision.py                          # every row; writes benchmarks/results/vision_<row>.txt
    python benchmarks/vision.py --rows smolvlm-256m

Rows are real VLMs' shapes with random weights (seed 0; nothing is
downloaded), built with ``from_config`` in fp32 (coreai-core's Linux CPU
runtime computes fp16 in software, about 100x slower, so runtime figures are
fp32's):

* ``smolvlm-256m``: SmolVLM-256M-Instruct's (``idefics3``): a SigLIP tower of
  12 layers, width 768, on 512x512 images in 16x16 patches (1024 patches),
  pixel-shuffled by 4 to 64 image tokens; a Llama decoder of 30 layers,
  width 576, 9 heads, 3 KV heads, vocab 49,280, tied embeddings.
* ``gemma3-4b-2l``: Gemma 3 4B's (``gemma3``) with its layers truncated: a
  SigLIP tower of width 1152 on 896x896 images (4096 patches) pooled to 256
  image tokens, 2 of its 27 layers; Gemma 3's decoder, width 2560, vocab
  262,208 (tied), 2 of its 34 (sliding, window 1024); one timed run, not three
  (a 4096-token tower call is minutes on this runtime).

Each row is one process: ``image_text_to_text.lower_vlm`` + ``to_executorch`` +
``write_to_file`` timed per phase with exact peak RSS
(``memory_profile.Profile``: the kernel's high-water mark reset at each
phase), then the ``.pte`` in ExecuTorch's runtime (Core AI delegates on the
host backend): ``vision_encoder`` on one image, the prompt's three
``text_decoder`` calls (16 text tokens, the image's embeddings, 8 text
tokens) as ``MultimodalRunner`` makes them, and 16 decode steps; the
prefill's last logits are checked against Hugging Face eager over the same
prompt.  "extra/w" is peak RSS above the built model over its weights.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import memory_profile  # noqa: E402
from memory_profile import GB, PHASES, Profile  # noqa: E402

#: The vision path's own functions, timed as phases beside memory_profile's.
VISION_PHASES = (
    ("coreai_partitioner.image_text_to_text.export", "adapt", "adapt the families"),
    ("coreai_partitioner.image_text_to_text.export", "export_methods", "export the three methods + externalize"),
    ("coreai_partitioner.records.externalize", "externalize_modules", "a method: export + externalize"),
    ("coreai_partitioner.lowering.whole_program", "lower_whole_programs", "lower the three methods (one to_backend)"),
    ("coreai_partitioner.backends.apple_coreai.preprocess", "_preprocess_functions", "preprocess: one asset, three functions"),
)

TEXT_BEFORE, TEXT_AFTER, DECODE = 16, 8, 16


def smolvlm_256m() -> Any:
    from transformers import Idefics3Config, Idefics3VisionConfig, LlamaConfig

    text = LlamaConfig(
        vocab_size=49280, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=True,
        rope_theta=100000.0, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    vision = Idefics3VisionConfig(
        hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=512,
        patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
    )
    return Idefics3Config(
        text_config=text.to_dict(), vision_config=vision.to_dict(), scale_factor=4, image_token_id=49190,
        tie_word_embeddings=True,
    )


def gemma3_4b(layers: int, vision_layers: int) -> Any:
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig

    text = Gemma3TextConfig(
        vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=layers, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, sliding_window=1024,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * (layers // 6) + ["sliding_attention"] * (layers % 6),
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
        },
        max_position_embeddings=131072,
    )
    vision = SiglipVisionConfig(
        hidden_size=1152, intermediate_size=4304, num_hidden_layers=vision_layers, num_attention_heads=16,
        image_size=896, patch_size=14, hidden_act="gelu_pytorch_tanh", vision_use_head=False, layer_norm_eps=1e-6,
    )
    return Gemma3Config(
        text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=256,
        image_token_index=262144, boi_token_index=255999, eoi_token_index=256000,
    )


#: name -> (config maker, max_context_len, max_seq_len, timed runs)
ROWS = {
    "smolvlm-256m": (smolvlm_256m, 256, 64, 3),
    "gemma3-4b-2l": (lambda: gemma3_4b(2, 2), 512, 256, 1),
}


def measure(name: str, out: Path) -> dict[str, Any]:
    """One row, in this process."""
    profile = Profile()
    with profile.phase("import"):
        import torch

        from coreai_partitioner import text_generation, image_text_to_text
        from coreai_partitioner.image_text_to_text import run

        for where, attr, label in (*PHASES, *VISION_PHASES):
            profile.wrap(where, attr, label)
    make, context, chunk, runs = ROWS[name]
    shapes = text_generation.DecoderShapes(max_context_len=context, prefill_chunk=chunk)
    with profile.phase("build the model (random weights)"):
        import transformers

        config = make()
        torch.manual_seed(0)
        model = transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="eager").eval()
    weights = memory_profile.weight_bytes(model)
    baseline = profile.restart_peak()
    started, cpu = time.perf_counter(), time.process_time()
    vlm = image_text_to_text.adapt(model, shapes)
    lowered = image_text_to_text.lower_vlm(model, shapes, vlm=vlm)
    with profile.phase("to_executorch"):
        program = lowered.to_executorch()
    with profile.phase("write_to_file"):
        with open(out, "wb") as file:
            program.write_to_file(file)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    del program, lowered
    peak = profile.peak

    # The prompt: text, the image, text; HF eager's last logits over it, then the .pte's.
    size = vlm.image_size
    pixels = torch.randn(3, *size, generator=torch.Generator().manual_seed(1))
    text = torch.randint(3, 1000, (TEXT_BEFORE + TEXT_AFTER,), generator=torch.Generator().manual_seed(2))
    ids = torch.cat([text[:TEXT_BEFORE], torch.full((vlm.image_tokens,), vlm.image_token_id), text[TEXT_BEFORE:]])[None]
    batch = pixels[None, None] if config.model_type == "idefics3" else pixels[None]
    with torch.no_grad():
        inputs = {"input_ids": ids, "pixel_values": batch}
        if config.model_type == "gemma3":
            inputs["token_type_ids"] = (ids == vlm.image_token_id).long()
        expected = model(**inputs).logits[0, -1]
    del model, vlm
    segments = [
        run.Segment(tokens=tuple(text[:TEXT_BEFORE].tolist())), run.Segment(pixels=pixels),
        run.Segment(tokens=tuple(text[TEXT_BEFORE:].tolist())),
    ]
    methods = run.Methods.of(out)
    methods.call("token_embedding", torch.tensor([[5]]))  # loads the program and its delegates
    timings: dict[str, list[float]] = {"vision_encoder": [], "text_decoder (image)": [], "prefill (3 calls)": [], "decode": []}
    for _ in range(runs):
        methods.reset()
        start = time.perf_counter()
        image = methods.call("vision_encoder", pixels[None])
        timings["vision_encoder"].append(time.perf_counter() - start)
        start = time.perf_counter()
        position = 0
        logits, position = run.prefill(methods, segments[0], position)
        begin = time.perf_counter()
        logits = methods.call("text_decoder", image, torch.arange(position, position + image.shape[1]))
        timings["text_decoder (image)"].append(time.perf_counter() - begin)
        position += image.shape[1]
        logits, position = run.prefill(methods, segments[2], position)
        timings["prefill (3 calls)"].append(time.perf_counter() - start + timings["vision_encoder"][-1])
        start = time.perf_counter()
        token = int(logits.reshape(-1)[-expected.shape[0]:].argmax())
        for _ in range(DECODE):
            step = methods.call("text_decoder", methods.call("token_embedding", torch.tensor([[token]])), torch.tensor([position]))
            token, position = int(step.reshape(-1).argmax()), position + 1
        timings["decode"].append((time.perf_counter() - start) / DECODE)
    error = float((logits.reshape(-1) - expected).abs().max())
    return {
        "row": name,
        "weights MB": weights / 1e6,
        "export s": seconds,
        "cpu s": cpu,
        "peak GB": peak / GB,
        "extra/w": max(0, peak - baseline) / weights,
        ".pte MB": out.stat().st_size / 1e6,
        ".pte/w": out.stat().st_size / weights,
        "image tokens": int(ids.shape[1] - TEXT_BEFORE - TEXT_AFTER),
        **{f"{k} ms": 1000 * statistics.median(v) for k, v in timings.items()},
        "prefill vs eager": error,
        "phases": profile.table(weights, baseline),
    }


def table(rows: list[dict[str, Any]]) -> str:
    columns = [
        "row", "weights MB", "export s", "cpu s", "peak GB", "extra/w", ".pte MB", ".pte/w", "image tokens",
        "vision_encoder ms", "text_decoder (image) ms", "prefill (3 calls) ms", "decode ms", "prefill vs eager",
    ]

    def cell(row: dict[str, Any], column: str) -> str:
        value = row[column]
        if column == "prefill vs eager":
            return f"{value:.1e}"
        return f"{value:.3f}" if column in (".pte/w", "extra/w") else f"{value:,.1f}" if isinstance(value, float) else str(value)

    cells = [columns] + [[cell(r, c) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))) for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    text = "\n".join(lines)
    for row in rows:
        text += f"\n\n{row['row']}: export phases (time, exact peak RSS; indented: inside the phase above)\n{row['phases']}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a row in this process, its result as JSON on stdout's last line
    args = parser.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory() as directory:
            result = measure(args.one, Path(directory) / "model.pte")
        print(json.dumps(result))
        return
    args.results.mkdir(parents=True, exist_ok=True)
    for name in args.rows:
        done = subprocess.run(
            [sys.executable, __file__, "--one", name], capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
        )
        if done.returncode != 0:
            raise SystemExit(f"{name} failed:\n{done.stderr[-5000:]}")
        text = table([json.loads(done.stdout.strip().splitlines()[-1])])
        print(text, flush=True)
        runs = ROWS[name][3]
        path = args.results / f"vision_{name}.txt"
        path.write_text(
            f"python benchmarks/vision.py --rows {name}\n(fp32, random weights; 2 shared cores; runtime times are "
            f"the median of {runs} run{'s' if runs > 1 else ''})\n\n{text}\n"
        )
        print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
