"""LLM export at scale: export cost, .pte size and runtime speed of text_generation.lower_decoder, against coreai-torch's one shot.

    python benchmarks/llm.py --cache-dir CKPTS                         # every row; writes benchmarks/results/llm.*
    python benchmarks/llm.py --cache-dir CKPTS --rows qwen3 qwen3-0.6b-28l
    python benchmarks/llm.py --load benchmarks/results/llm.json        # the table and plot again
    python benchmarks/llm.py --load WORK_DIR --results DIR             # results of the rows finished so far

Rows: tiny Llama, Qwen3, Mistral, Gemma 3, Qwen3-MoE and Qwen3.5 configs
(``text_generation.tiny_config``, fp32), the Qwen3-0.6B shape at 4, 14 and 28 layers, a
Llama-3.2-1B shape, Qwen3-30B-A3B's layer shape (128 experts of width 768, 8
active, d 2048) at 4 layers and Qwen3.5's (``Qwen3_5TextConfig``'s defaults:
d 4096, gated delta rule with 32 value heads) at 8 (fp16, random weights
saved once under ``--cache-dir`` with ``save_pretrained`` and loaded back
with ``from_pretrained``; nothing is downloaded).  ``*-fp32`` rows are there
for runtime figures (``qwen3-30b-a3b-1l-fp32`` at one layer: a 64-token call
gathers 512 (token, expert) weight rows, 6.4 GB in fp32; ``qwen3.5-4l-fp32``
with its embedding tied, 4 GB less); ``qwen3-0.6b-28l-fp32-all-logits`` exports every
position's logits, beside the default last position's.  ``llama-3.1-8b-int4``
and ``llama-3.1-8b-palettize4`` are Llama-3.1-8B's shape (32 layers, d 4096,
MLP 14336, vocab 128,256 untied, 32 heads, 8 KV heads), fp16, quantized at
export (``lower_decoder(quantize=)``): coreai-opt's int4 blocks beside k-means
look-up tables over 8B weights; run them alone on a quiet machine (``--rows
llama-3.1-8b-int4 llama-3.1-8b-palettize4 --paths plugin``; the checkpoint is
16 GB under ``--cache-dir``).  Eager's logits are
computed and the model freed before the runtime loads the ``.pte``.  Every row is two processes, one after the other: the plugin
path (``text_generation.lower_decoder`` + ``to_executorch`` + ``write_to_file``, what
``examples/export_llm.py`` does) and coreai-torch's one-shot conversion of
the same model.  Time and exact peak RSS per phase come from
``memory_profile.measure_export``.  The plugin process then loads the
``.pte`` in ExecuTorch's runtime (host Core AI backend) and times a 64-token
prompt as one ``forward`` call and as 64 single-token calls (warm, median),
greedy decode tokens/s, and checks the one-call prefill's logits against
Hugging Face eager (the rows in ``TIMED_ROWS``, or every row with
``--runtime-all``).  The ``qwen3-0.6b-28l-fp32`` row is the 28-layer 0.6B
checkpoint loaded in fp32, for runtime figures at that width: coreai-core's
Linux CPU runtime computes fp16 in software (about 0.05 GFLOP/s, ~100x below
its fp32), so an fp16 64-token prefill at d 1024 takes about 25 minutes.  "export" is from the loaded model to the written file;
imports and loading are apart.  "extra/w" is peak RSS above the loaded
model, over the weight bytes (a tied embedding counted once).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
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
from memory_profile import GB, QWEN3_06B, QWEN3_14B, QWEN3_30B_A3B  # noqa: E402

PROMPT = 64
DECODE = 32
MAX_CONTEXT_LEN = 128

#: name -> (how to build it, dtype, layers, export options): "tiny:<model_type>" or a checkpoint recipe.
ROWS = {
    "llama": ("tiny:llama", "fp32", 2, {}),
    "qwen3": ("tiny:qwen3", "fp32", 2, {}),
    "mistral": ("tiny:mistral", "fp32", 2, {}),
    "gemma3": ("tiny:gemma3_text", "fp32", 4, {}),
    "qwen3-moe": ("tiny:qwen3_moe", "fp32", 3, {}),
    "qwen3.5": ("tiny:qwen3_5_text", "fp32", 4, {}),
    "qwen3-0.6b-4l": ("qwen3-0.6b", "fp16", 4, {}),
    "qwen3-0.6b-14l": ("qwen3-0.6b", "fp16", 14, {}),
    "qwen3-0.6b-28l": ("qwen3-0.6b", "fp16", 28, {}),
    "llama-3.2-1b": ("llama-3.2-1b", "fp16", 16, {}),
    "qwen3-0.6b-28l-fp32": ("qwen3-0.6b", "fp32", 28, {}),
    "qwen3-0.6b-28l-fp32-all-logits": ("qwen3-0.6b", "fp32", 28, {"full_logits": True}),
    "qwen3-30b-a3b-4l": ("qwen3-30b-a3b", "fp16", 4, {}),
    "qwen3-30b-a3b-1l-fp32": ("qwen3-30b-a3b", "fp32", 1, {}),
    "qwen3.5-8l": ("qwen3.5", "fp16", 8, {}),
    "qwen3.5-4l-fp32": ("qwen3.5-tied", "fp32", 4, {}),
    # the device form (text_generation.lower_decoder(target="device")) beside the host rows of the same checkpoint
    "qwen3-0.6b-28l-device": ("qwen3-0.6b", "fp16", 28, {"target": "device"}),
    "qwen3-0.6b-28l-fp32-device": ("qwen3-0.6b", "fp32", 28, {"target": "device"}),
    # Llama-3.1-8B's shape, weight-only quantized: k-means look-up tables beside coreai-opt's int4 blocks
    "llama-3.1-8b-int4": ("llama-3.1-8b", "fp16", 32, {"quantize": "int4"}),
    "llama-3.1-8b-palettize4": ("llama-3.1-8b", "fp16", 32, {"quantize": "palettize4"}),
    # the same, each stored weight read from the checkpoint as it is compressed (quantize/streamed.py: what the export
    # command does under --quantize without --verify)
    "llama-3.1-8b-int4-streamed": ("llama-3.1-8b", "fp16", 32, {"quantize": "int4", "streamed": True}),
    "llama-3.1-8b-palettize4-streamed": ("llama-3.1-8b", "fp16", 32, {"quantize": "palettize4", "streamed": True}),
    # Qwen3-14B's shape from a bf16 checkpoint larger than this machine's memory (28 GB), int4, streamed; and its
    # first two layers (the same file, the rest of its layers not read) in fp32, whose .pte is checked in the runtime
    # against the quantized eager model over a 16-token prompt: the whole 14B in fp16 would take hours in coreai-core's
    # software fp16 on this CPU
    "qwen3-14b-int4-streamed": ("qwen3-14b", "fp16", 40, {"quantize": "int4", "streamed": True}),
    "qwen3-14b-first-2l-int4-fp32": (
        "qwen3-14b", "fp32", 40, {"quantize": "int4", "streamed": True, "layers_kept": 2, "check_tokens": 16},
    ),
}
#: Row options for the loader or the check, not the export.
LOADER_OPTIONS = ("streamed", "layers_kept", "check_tokens")
#: Checkpoints written a tensor at a time (memory_profile.write_checkpoint), in this dtype: larger than memory.
WRITTEN_BY_TENSOR = {"qwen3-14b": "bf16"}
PATHS = ("plugin", "oneshot")
#: Rows timed in the runtime (others with --runtime-all).  At the 0.6B width coreai-core's Linux CPU
#: runtime runs fp16 in software: a 64-token call of the 4-layer fp16 row took 546 s, 377 s of it the
#: lm_head (0.05 GFLOP/s against 5 GFLOP/s in fp32), so that width is timed in fp32.
TIMED_ROWS = (
    "llama", "qwen3", "mistral", "gemma3", "qwen3-moe", "qwen3.5",
    "qwen3-0.6b-28l-fp32", "qwen3-0.6b-28l-fp32-all-logits", "qwen3-30b-a3b-1l-fp32", "qwen3.5-4l-fp32",
    "qwen3-0.6b-28l-fp32-device",
)
#: Rows only there for runtime figures: the one-shot comparison is the fp16 row's (and the MoE rows have
#: none: coreai-torch's one shot holds about 2.3x the weights, 14 GB at 4 layers of 128 experts).
RUNTIME_ONLY_ROWS = (
    "qwen3-0.6b-28l-fp32", "qwen3-0.6b-28l-fp32-all-logits", "qwen3-30b-a3b-4l", "qwen3-30b-a3b-1l-fp32",
    "qwen3.5-8l", "qwen3.5-4l-fp32", "qwen3-0.6b-28l-device", "qwen3-0.6b-28l-fp32-device",
    "llama-3.1-8b-int4", "llama-3.1-8b-palettize4",  # coreai-torch's one shot of 8B weights: ~37 GB
    "llama-3.1-8b-int4-streamed", "llama-3.1-8b-palettize4-streamed",
    "qwen3-14b-int4-streamed", "qwen3-14b-first-2l-int4-fp32",
)
#: Rows with experts: a one-call prefill gathers every (token, expert) pair's weights, as single calls do.
MOE_ROWS = ("qwen3-moe", "qwen3-30b-a3b-4l", "qwen3-30b-a3b-1l-fp32")
#: Above this many weight bytes a row repeats its timed calls less (seconds per call at d 1024).
LARGE = 100e6


def checkpoint_config(recipe: str, layers: int) -> Any:
    import transformers

    if recipe == "qwen3-0.6b":
        return transformers.Qwen3Config(num_hidden_layers=layers, **QWEN3_06B)
    if recipe == "qwen3-30b-a3b":
        return transformers.Qwen3MoeConfig(num_hidden_layers=layers, **QWEN3_30B_A3B)
    if recipe == "qwen3.5":  # Qwen3_5TextConfig's defaults (hidden 4096, 32 heads of 128 for the delta rule)
        return transformers.Qwen3_5TextConfig(num_hidden_layers=layers)
    if recipe == "qwen3.5-tied":  # the same with one 248,320 x 4096 embedding: 4 GB less in fp32
        return transformers.Qwen3_5TextConfig(num_hidden_layers=layers, tie_word_embeddings=True)
    if recipe == "llama-3.1-8b":
        return transformers.LlamaConfig(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
            rope_theta=500000.0, max_position_embeddings=131072,
        )
    if recipe == "qwen3-14b":
        return transformers.Qwen3Config(**{**QWEN3_14B, "num_hidden_layers": layers})
    if recipe == "llama-3.2-1b":
        return transformers.LlamaConfig(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=layers,
            num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True, head_dim=64,
        )
    raise ValueError(f"no checkpoint recipe {recipe!r}")


def model_loader(name: str, cache_dir: Path):
    """A ``load()`` for :func:`memory_profile.measure_export`; a checkpoint is saved first if missing."""
    import torch

    recipe, dtype_name, layers, options = ROWS[name]
    dtype = {"fp32": torch.float32, "fp16": torch.float16}[dtype_name]
    if recipe.startswith("tiny:"):
        def load():
            from transformers import AutoModelForCausalLM

            from coreai_partitioner import text_generation

            torch.manual_seed(0)
            return AutoModelForCausalLM.from_config(text_generation.tiny_config(recipe[5:]), attn_implementation="eager").to(dtype).eval()

        return load
    path = checkpoint(name, cache_dir)

    def load():
        from transformers import AutoModelForCausalLM

        config = stored_config(path, options.get("layers_kept"))
        if options.get("streamed"):
            from coreai_partitioner.quantize.streamed import load_streamed

            return load_streamed(AutoModelForCausalLM, path, config, dtype, options["quantize"])
        return AutoModelForCausalLM.from_pretrained(
            path, config=config, dtype=dtype, local_files_only=True, attn_implementation="eager"
        ).eval()

    return load


def checkpoint(name: str, cache_dir: Path) -> Path:
    """The checkpoint of a row with a recipe under ``cache_dir``, saved (or written a tensor at a time) if missing."""
    import torch

    recipe, _, layers, _ = ROWS[name]
    if recipe in WRITTEN_BY_TENSOR:
        stored = WRITTEN_BY_TENSOR[recipe]
        return memory_profile.write_checkpoint(checkpoint_config(recipe, layers),
                                               cache_dir / f"{recipe}-shape-{layers}l-{stored}",
                                               {"bf16": torch.bfloat16, "fp16": torch.float16}[stored])
    return memory_profile.save_checkpoint(checkpoint_config(recipe, layers), cache_dir / f"{recipe}-shape-{layers}l-fp16")


def stored_config(path: Path, layers_kept: int | None = None) -> Any:
    """The checkpoint's config; with ``layers_kept``, its first that many layers (the others' weights are not read)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if layers_kept:
        config.num_hidden_layers = layers_kept
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:layers_kept]
    return config


# ---------------------------------------------------------------- one process: one row, one path


def _tree(span: memory_profile.Span) -> dict:
    return {"label": span.label, "s": span.end, "cpu": span.cpu, "calls": span.calls, "rss_before": span.rss_before,
            "rss_after": span.rss_after, "peak": span.peak, "children": [_tree(c) for c in span.children.values()]}


def eager_reference(model: Any, full_logits: bool = False) -> tuple[Any, Any]:
    """The timed prompt and Hugging Face eager's logits for it (the last position's unless ``full_logits``)."""
    import torch

    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (1, PROMPT), generator=generator)
    with torch.no_grad():
        expected = model(prompt).logits
    return prompt, expected if full_logits else expected[:, -1:]  # what forward returns by default


def time_runtime(pte: Path, prompt: Any, expected: Any, large: bool, device: bool = False) -> dict:
    """Time to first token (one call vs one call per token), decode tokens/s, prefill logits vs ``expected``.

    Warm medians of 5 one-call prefills and 2 token-by-token ones and 32 decode steps; a ``large``
    model (seconds per call) runs 2, 1 and 8.  The device form's one call is its ``prefill`` method
    (the chunk is the prompt), the rest its ``forward``.
    """
    import torch

    from coreai_partitioner import load_runtime_backend, verify
    from executorch.runtime import Runtime

    load_runtime_backend()
    start = time.perf_counter()
    program = Runtime.get().load_program(str(pte))
    method = program.load_method("forward")
    prefill = program.load_method("prefill") if device else method
    load_s = time.perf_counter() - start
    positions = torch.arange(PROMPT)

    def one_call():
        return prefill.execute([prompt, positions])[0]

    def token_by_token():
        for i in range(PROMPT):
            logits = method.execute([prompt[:, i : i + 1], positions[i : i + 1]])[0]
        return logits

    def timed(fn, repeats):
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds), seconds

    cold, _ = timed(one_call, 1)  # compiles on first use
    single_cold, _ = timed(lambda: method.execute([prompt[:, :1], positions[:1]]), 1)
    one, _ = timed(one_call, 2 if large else 5)
    per_token, _ = timed(token_by_token, 1 if large else 2)
    decode = 8 if large else DECODE
    logits = one_call()  # the cache now holds the prompt
    tokens = [int(logits[0, -1].argmax())]
    start = time.perf_counter()
    for i in range(decode):
        logits = method.execute([torch.tensor([[tokens[-1]]]), torch.tensor([PROMPT + i])])[0]
        tokens.append(int(logits[0, -1].argmax()))
    decode_s = time.perf_counter() - start
    got = one_call()
    atol, rtol = verify.default_tolerances(expected.dtype)
    error = (got.float() - expected.float()).abs()
    return {
        "load_pte_s": load_s,
        "ttft_cold_s": cold,
        "single_cold_s": single_cold,
        "ttft_one_call_s": one,
        "ttft_token_by_token_s": per_token,
        "decode_tokens_per_s": decode / decode_s,
        "prefill_max_abs_err": float(error.max()),
        "prefill_matches_eager": bool(torch.allclose(got.float(), expected.float(), atol=atol, rtol=rtol)),
        "tolerance": [atol, rtol],
    }


def check_quantized(model: Any, eager: Any, pte: Path, tokens: int, scheme: str) -> dict:
    """The ``.pte`` of a quantized row run in ExecuTorch's runtime over a random ``tokens``-token prompt from an empty
    cache, then 4 greedy tokens one a call, against its quantized eager model ``eager`` (``lower_decoder``'s
    ``quantized_reference``): ``text_generation.check``, what ``export --verify`` runs.  The fp32 model the prompt
    and tokens come from is loaded whole from the checkpoint after the export, ``model`` (the exported one) freed."""
    import torch
    from transformers import AutoModelForCausalLM

    from coreai_partitioner import load_runtime_backend, text_generation
    from coreai_partitioner.text_generation import check

    config, path = model.config, model.config._name_or_path
    del model
    gc.collect()
    shapes = text_generation.DecoderShapes(max_context_len=MAX_CONTEXT_LEN, prefill_chunk=PROMPT)
    start = time.perf_counter()
    fp32 = AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=torch.float32, local_files_only=True, attn_implementation="eager"
    ).eval()
    reference = check.reference(fp32, shapes, prompt_tokens=tokens, new_tokens=4)
    del fp32
    gc.collect()
    expected = check.eager_logits(eager, reference, shapes)
    del eager
    gc.collect()
    load_runtime_backend()
    report = check.check(str(pte), reference, shapes, eager=expected, dtype=torch.float32, quantize=scheme)
    print(report, flush=True)
    return {"check_ok": report.ok, "check_report": str(report), "check_prompt_tokens": tokens,
            "check_s": time.perf_counter() - start}


def worker(name: str, path: str, cache_dir: Path, out_dir: Path, result_file: Path, runtime: bool) -> dict:
    started = time.perf_counter()
    load = model_loader(name, cache_dir)
    profile = memory_profile.Profile()
    out = out_dir / f"{name}.pte"
    options = ROWS[name][3]
    held = [] if "check_tokens" in options else None
    model, measurement = memory_profile.measure_export(
        load, out, max_context_len=MAX_CONTEXT_LEN, prefill_chunk=PROMPT, oneshot=path == "oneshot", profile=profile,
        quantized_reference=held, **{key: value for key, value in options.items() if key not in LOADER_OPTIONS},
    )
    print(measurement.report(name, path == "oneshot"), flush=True)
    result = {
        "row": name, "path": path, "dtype": ROWS[name][1], "layers": model.config.num_hidden_layers,
        "weights": measurement.weights, "baseline": measurement.baseline, "peak": profile.peak,
        "extra_over_weights": measurement.extra_over_weights, "size": measurement.size,
        "export_s": measurement.seconds, "export_cpu_s": measurement.cpu, "phases": _tree(profile.root)["children"],
        "table": profile.table(measurement.weights, measurement.baseline),
    }
    if held:
        result_file.write_text(json.dumps(result))
        result.update(check_quantized(model, held.pop(), out, options["check_tokens"], options["quantize"]))
    elif path == "plugin" and runtime:
        result_file.write_text(json.dumps(result))  # the export's figures survive a runtime that does not finish
        prompt, expected = eager_reference(model, options.get("full_logits", False))
        del model  # the runtime's copy of the weights is loaded next: at the real widths both do not fit
        gc.collect()
        result.update(time_runtime(out, prompt, expected, measurement.weights > LARGE, options.get("target") == "device"))
    out.unlink(missing_ok=True)
    shutil.rmtree(out.with_suffix(".aimodel"), ignore_errors=True)  # the one shot's asset
    result["process_s"] = time.perf_counter() - started
    return result


# ---------------------------------------------------------------- driver: every row in its own processes


def _find(phases: list[dict], *labels: str) -> dict | None:
    """The phase reached by following ``labels`` down the tree, each found at any depth below the last."""
    for phase in phases:
        if phase["label"] == labels[0]:
            return phase if len(labels) == 1 else _find(phase["children"], *labels[1:])
        found = _find(phase["children"], *labels)
        if found is not None:
            return found
    return None


def seconds(result: dict, *labels: str) -> float:
    phase = _find(result["phases"], *labels)
    return phase["s"] if phase else 0.0


#: Columns of the export-time breakdown: (heading, phase path).
BREAKDOWN = (
    ("externalize", ("export + externalize",)),
    ("  trace to ATen", ("export + externalize", "torch.export to decomposed ATen")),
    ("  sub-exports", ("export + externalize", "sub-exports")),
    ("  quantize", ("export + externalize", "quantize")),
    ("narrow dtypes", ("narrow dtypes",)),
    ("to_backend", ("to_backend",)),
    ("  preprocess", ("to_backend", "preprocess")),
    ("to_executorch", ("to_executorch",)),
    ("write", ("write_to_file",)),
)


def run_row(name: str, path: str, args: argparse.Namespace) -> dict | None:
    log = args.work_dir / "logs" / f"{name}-{path}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    result_file = args.work_dir / f"{name}-{path}.json"
    result_file.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--worker", name, path, "--cache-dir", str(args.cache_dir),
               "--work-dir", str(args.work_dir)]
    if args.runtime_all or name in TIMED_ROWS:
        command.append("--runtime")
    print(f"{name} ({path}) ...", end=" ", flush=True)
    start = time.perf_counter()
    with open(log, "w") as file:
        code = subprocess.run(command, stdout=file, stderr=subprocess.STDOUT).returncode
    if code != 0 or not result_file.exists():
        print(f"FAILED (exit {code}); see {log}")
        return {"row": name, "path": path, "failed": f"exit {code}, log {log}"}
    print(f"{time.perf_counter() - start:.0f} s")
    return json.loads(result_file.read_text())


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def tables(results: list[dict]) -> str:
    plugin = {r["row"]: r for r in results if r["path"] == "plugin"}
    oneshot = {r["row"]: r for r in results if r["path"] == "oneshot"}
    rows = [r for r in ROWS if r in plugin or r in oneshot]
    head = ["row", "dtype", "layers", "weights MB", "export s", "cpu s", "import s", "load s", "extra/w", ".pte/w",
            "TTFT 1 call ms", "TTFT 64 calls ms", "speedup", "decode tok/s", "prefill vs eager",
            "one-shot s", "one-shot cpu s", "one-shot extra/w"]
    lines = []
    for name in rows:
        p, o = plugin.get(name, {}), oneshot.get(name, {})
        ok = bool(p) and "failed" not in p
        lines.append([
            name, ROWS[name][1], str(p.get("layers", ROWS[name][2])),
            _fmt(p.get("weights", o.get("weights", 0)) / 1e6 if ok else None, ".1f"),
            _fmt(p.get("export_s") if ok else None, ".1f"),
            _fmt(p.get("export_cpu_s") if ok else None, ".1f"),
            _fmt(seconds(p, "import") if ok else None, ".1f"),
            _fmt(seconds(p, "load") if ok else None, ".1f"),
            _fmt(p.get("extra_over_weights"), ".2f"),
            _fmt(p["size"] / p["weights"] if ok else None, ".3f"),
            _fmt(1e3 * p["ttft_one_call_s"] if "ttft_one_call_s" in p else None, ".0f"),
            _fmt(1e3 * p["ttft_token_by_token_s"] if "ttft_token_by_token_s" in p else None, ".0f"),
            _fmt(p["ttft_token_by_token_s"] / p["ttft_one_call_s"] if "ttft_one_call_s" in p else None, ".1f"),
            _fmt(p.get("decode_tokens_per_s"), ".1f"),
            ("ok" if p["prefill_matches_eager"] else "MISMATCH") + f" ({p['prefill_max_abs_err']:.1e})"
            if "prefill_matches_eager" in p else ("ok (check)" if p["check_ok"] else "MISMATCH (check)")
            if "check_ok" in p else "-",
            _fmt(o.get("export_s"), ".1f"),
            _fmt(o.get("export_cpu_s"), ".1f"),
            _fmt(o.get("extra_over_weights"), ".2f"),
        ])
    out = [_grid(head, lines)]
    breakdown = [[name] + [_fmt(seconds(plugin[name], *labels), ".1f") for _, labels in BREAKDOWN]
                 + [_fmt(plugin[name]["export_s"], ".1f")]
                 for name in rows if name in plugin and "failed" not in plugin[name]]
    out.append("plugin export time by phase, s (indented: inside the phase above)\n"
               + _grid(["row"] + [h for h, _ in BREAKDOWN] + ["total"], breakdown))
    out.append("targets\n" + "\n".join(targets(plugin, oneshot)))
    failed = [f"{r['row']} ({r['path']}): {r['failed']}" for r in results if "failed" in r]
    if failed:
        out.append("failed\n" + "\n".join(failed))
    return "\n\n".join(out)


def _grid(head: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [head, *lines]) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
            for row in [head, *lines]]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def targets(plugin: dict, oneshot: dict) -> list[str]:
    lines = []

    def check(ok: bool | None, text: str) -> None:
        lines.append(f"  {'-' if ok is None else 'ok' if ok else 'MISSED':6}  {text}")

    def good(name: str, results: dict) -> dict | None:
        r = results.get(name)
        return r if r and "failed" not in r else None

    big = good("qwen3-0.6b-28l", plugin)
    big_oneshot = good("qwen3-0.6b-28l", oneshot)
    if big:
        check(big["extra_over_weights"] < 2, f"0.6B: peak RSS over the loaded model {big['extra_over_weights']:.2f}x weights < 2x")
        check(big["export_s"] < 60, f"0.6B: whole export {big['export_s']:.1f} s < 60 s ({os.cpu_count()} cores; "
              f"+{seconds(big, 'import'):.1f} s imports, {seconds(big, 'load'):.1f} s load)")
    if big and big_oneshot:
        check(big["export_s"] < big_oneshot["export_s"],
              f"0.6B: export time {big['export_s']:.1f} s vs one shot {big_oneshot['export_s']:.1f} s")
        check(big["extra_over_weights"] < big_oneshot["extra_over_weights"],
              f"0.6B: extra peak {big['extra_over_weights']:.2f}x vs one shot {big_oneshot['extra_over_weights']:.2f}x")
    half = good("qwen3-0.6b-14l", plugin)
    if big and half:
        time_ratio = big["export_s"] / half["export_s"]
        memory_ratio = (big["peak"] - big["baseline"]) / max(1, half["peak"] - half["baseline"])
        check(time_ratio <= 2.2, f"14 -> 28 layers: export time x{time_ratio:.2f} <= 2.2")
        check(memory_ratio <= 2.2, f"14 -> 28 layers: extra peak memory x{memory_ratio:.2f} <= 2.2 "
              f"({(half['peak'] - half['baseline']) / GB:.2f} -> {(big['peak'] - big['baseline']) / GB:.2f} GB)")
    one_b = plugin.get("llama-3.2-1b")
    if one_b:
        check("failed" not in one_b, "Llama-3.2-1B shape exports on this 24 GB machine"
              + (f" (peak {one_b['peak'] / GB:.1f} GB, {one_b['extra_over_weights']:.2f}x extra)" if "peak" in one_b else ""))
    last, every = good("qwen3-0.6b-28l-fp32", plugin), good("qwen3-0.6b-28l-fp32-all-logits", plugin)
    if last and every and "ttft_one_call_s" in last and "ttft_one_call_s" in every:
        check(last["ttft_one_call_s"] < every["ttft_one_call_s"],
              f"0.6B fp32: one-call {PROMPT}-token prefill {last['ttft_one_call_s']:.2f} s returning the last "
              f"position's logits vs {every['ttft_one_call_s']:.2f} s returning every position's")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for name in ("llama-3.1-8b-int4", "llama-3.1-8b-palettize4"):
        r = plugin.get(name)
        if r:
            check("failed" not in r, f"{name}: exports on this {memory / GB:.0f} GB machine"
                  + (f" (peak {r['peak'] / GB:.1f} GB, {r['extra_over_weights']:.2f}x extra; {r['export_s']:.0f} s)"
                     if "peak" in r else ""))
    r = good("qwen3-14b-int4-streamed", plugin)
    if r:
        check(r["peak"] <= 12e9, f"Qwen3-14B shape, int4 from its {r['weights'] / 1e9:.1f} GB checkpoint: peak "
              f"{r['peak'] / 1e9:.2f} GB <= 12 GB on this {memory / GB:.0f} GB machine ({r['export_s']:.0f} s)")
    r = good("qwen3-14b-first-2l-int4-fp32", plugin)
    if r and "check_ok" in r:
        check(r["check_ok"], f"Qwen3-14B shape, its first 2 layers: the .pte over a {r['check_prompt_tokens']}-token "
              "prompt gives the quantized eager model's logits (text_generation.check)")
    for name in ("qwen3-30b-a3b-4l", "qwen3.5-8l"):
        r = good(name, plugin)
        if r:
            check(r["extra_over_weights"] <= 0.5, f"{name}: peak RSS over the loaded model {r['extra_over_weights']:.2f}x "
                  f"the weights <= 0.5 ({r['weights'] / GB:.1f} GB of weights)")
    for name in ROWS:
        r = good(name, plugin)
        if r:  # a tiny row's 16 kB of program is a few percent of its weights: reported, not judged
            check(r["size"] / r["weights"] <= 1.05 if r["weights"] >= 1e6 else None,
                  f"{name}: .pte {r['size'] / r['weights']:.3f}x weights <= 1.05 "
                  f"({(r['size'] - r['weights']) / 1e3:,.0f} kB above the weights)")
    for name in ROWS:
        r = good(name, plugin)
        if r and "ttft_one_call_s" in r:
            speedup = r["ttft_token_by_token_s"] / r["ttft_one_call_s"]
            moe = name in MOE_ROWS  # gather_mm gathers one expert weight row per (token, expert): the same bytes either way
            check(None if moe else speedup >= 10, f"{name}: one-call prefill {speedup:.1f}x faster than "
                  f"{PROMPT} single calls" + (" (experts: gathered per token)" if moe else " >= 10x"))
    for name in ROWS:
        r = good(name, plugin)
        if r and "prefill_matches_eager" in r:
            check(r["prefill_matches_eager"], f"{name}: one-call prefill logits from the .pte match HF eager "
                  f"(max abs err {r['prefill_max_abs_err']:.1e}, atol/rtol {r['tolerance'][0]:g}/{r['tolerance'][1]:g})")
    return lines


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plugin = {r["row"]: r for r in results if r["path"] == "plugin" and "failed" not in r}
    oneshot = {r["row"]: r for r in results if r["path"] == "oneshot" and "failed" not in r}
    names = [n for n in ROWS if n in plugin]
    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.8))
    x = range(len(names))
    bottom = [0.0] * len(names)
    for heading, labels in BREAKDOWN:
        if heading.startswith("  "):
            continue
        values = [seconds(plugin[n], *labels) for n in names]
        left.bar(x, values, 0.4, bottom=bottom, label=heading)
        bottom = [b + v for b, v in zip(bottom, values)]
    left.bar([i + 0.4 for i in x], [oneshot[n]["export_s"] if n in oneshot else 0 for n in names], 0.4,
             color="grey", label="coreai-torch one shot")
    left.axhline(60, color="red", linestyle="--", linewidth=1, label="60 s target")
    left.set_ylabel("export s (loaded model -> file)")
    left.set_title("export time")
    left.legend(fontsize=7)
    middle.bar([i - 0.2 for i in x], [plugin[n]["extra_over_weights"] for n in names], 0.4, label="plugin")
    middle.bar([i + 0.2 for i in x], [oneshot[n]["extra_over_weights"] if n in oneshot else 0 for n in names], 0.4,
               color="grey", label="coreai-torch one shot")
    middle.axhline(2, color="red", linestyle="--", linewidth=1, label="2x target")
    middle.set_yscale("log")  # the tiny configs' fixed overhead is 100x their weights
    middle.set_ylabel("peak RSS above the loaded model / weights")
    middle.set_title("export peak memory")
    middle.legend(fontsize=7)
    timed = [n for n in names if "ttft_one_call_s" in plugin[n]]
    xt = range(len(timed))
    right.bar([i - 0.2 for i in xt], [1e3 * plugin[n]["ttft_one_call_s"] for n in timed], 0.4, label="one call")
    right.bar([i + 0.2 for i in xt], [1e3 * plugin[n]["ttft_token_by_token_s"] for n in timed], 0.4,
              label=f"{PROMPT} single-token calls")
    right.set_yscale("log")
    right.set_ylabel(f"ms to first token, {PROMPT}-token prompt")
    right.set_title("prefill from the .pte (ExecuTorch runtime)")
    right.legend(fontsize=7)
    for axis, labels in ((left, names), (middle, names), (right, timed)):
        axis.set_xticks(range(len(labels)))
        axis.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=tuple(ROWS), default=list(ROWS))
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "coreai_llm_checkpoints",
                        help="where the random-weight checkpoints are saved once")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "coreai_llm_bench",
                        help=".pte files (deleted after each row), logs and per-row JSON")
    parser.add_argument("--results", type=Path, default=HERE / "results", help="llm.json, llm.txt, llm.png go here")
    parser.add_argument("--load", type=Path, help="print a saved llm.json instead of running, or collect "
                        "the rows a run finished from its --work-dir (and write --results)")
    parser.add_argument("--runtime-all", action="store_true",
                        help=f"time the .pte in the runtime for every row, not only {', '.join(TIMED_ROWS)}")
    parser.add_argument("--worker", nargs=2, metavar=("ROW", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--runtime", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        name, path = args.worker
        result_file = args.work_dir / f"{name}-{path}.json"
        result = worker(name, path, args.cache_dir, args.work_dir, result_file, args.runtime)
        result_file.write_text(json.dumps(result))
        return
    if args.load is not None and args.load.is_file():
        print("\n" + tables(json.loads(args.load.read_text())["results"]))
        return
    if args.load is not None:
        results = [json.loads(f.read_text()) for f in sorted(args.load.glob("*-*.json"))]
        results.sort(key=lambda r: (list(ROWS).index(r["row"]), PATHS.index(r["path"])))
    else:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        results = [run_row(name, path, args) for name in args.rows for path in args.paths
                   if not (path == "oneshot" and name in RUNTIME_ONLY_ROWS)]
    args.results.mkdir(parents=True, exist_ok=True)
    meta = {"cores": os.cpu_count(), "prompt": PROMPT, "decode": DECODE, "max_context_len": MAX_CONTEXT_LEN}
    (args.results / "llm.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    text = tables(results)
    print("\n" + text)
    (args.results / "llm.txt").write_text(text + "\n")
    plot(results, args.results / "llm.png")
    print(f"\nwrote {args.results / 'llm.json'}, llm.txt, llm.png")

if __name__ == "__main__":
    main()
