"""torchvision models lowered by the coreai and xnnpack flows side by side: time and peak RSS per phase, ``.pte`` size,
nodes in and outside the delegates, runtime and SNR against eager.

    python benchmarks/vision_models.py                          # every model; writes benchmarks/results/vision_models.*
    python benchmarks/vision_models.py --models resnet18 vit_b_16_random_head
    python benchmarks/vision_models.py --load benchmarks/results/vision_models.json
    python benchmarks/vision_models.py --models resnet18 --flows coreai coreai-int8 coreai-palettize4 xnnpack

Each (model, flow) row is one process: build the model (random weights, as
ExecuTorch's backend suite does; ``vit_b_16_random_head`` draws the head
torchvision zero-initialises), then the backend suite's own ``Tester`` of
that flow (``tests/backend_suite/flows.py`` for coreai, ExecuTorch's
XNNPACK tester) runs its stages, each a timed phase with its exact peak RSS
(``memory_profile.Profile``): ``torch.export``, ``to_edge_transform_and_lower``,
``to_executorch`` and serialization.  The quantized flows (``coreai-int8``,
``coreai-palettize4``; by default for ``QUANTIZED_MODELS``) lower as
``lower(model, sample, quantize=scheme)`` does: ``export_with_composites``
(export, externalize, quantize: the "export" column) then ``lower_exported``;
"export + lower" is the two together, the time ``lower()`` takes.  Then ExecuTorch's runtime loads the
``.pte`` and runs it (the median of ``--runs`` calls after one warm-up).  The
coreai flow's delegates run on coreai-core's Linux CPU runtime, on this
2-core machine: not a device's figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

RESULTS = HERE / "results"
FLOWS = ("coreai", "xnnpack")
#: coreai through lower(quantize=...): the flow's name is "coreai-" and the scheme
QUANTIZED_FLOWS = ("coreai-int8", "coreai-palettize4")
#: the models the quantized flows run for by default, beside the fp32 coreai and xnnpack rows (vit_b_16 with its head
#: drawn: a zero head gives zero logits whatever the weights)
QUANTIZED_MODELS = ("resnet18", "vit_b_16_random_head")
#: weights the int schemes do not store (no Linear, convolution or embedding reads them), kept float
KEEP_FLOAT = {"vit_b_16": ["class_token", "encoder.pos_embedding"]}
#: ExecuTorch's backend suite's torchvision models (models/test_torchvision.py, static shapes), resnet18 beside them,
#: and vit_b_16 with a drawn head.
MODELS = (  # lightest first, so that a run stopped early has measured the most models
    "squeezenet1_1", "mobilenet_v3_small", "shufflenet_v2_x1_0", "mnasnet1_0", "mobilenet_v2", "resnet18", "googlenet",
    "regnet_y_1_6gf", "efficientnet_v2_s", "resnet50", "resnext50_32x4d", "efficientnet_b4", "inception_v3", "alexnet",
    "swin_v2_t", "maxvit_t", "convnext_small", "densenet161", "wide_resnet50_2", "vgg11", "vit_b_16",
    "vit_b_16_random_head",
)


def build(name: str):
    import torch

    import backend_suite.torchvision_ops  # noqa: F401  (torchvision's operator schemas, before torchvision)
    import torchvision

    torch.manual_seed(0)
    if name == "vit_b_16_random_head":
        model = torchvision.models.vit_b_16()
        torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    else:
        model = getattr(torchvision.models, name)()
    size = 299 if name == "inception_v3" else 224
    return model.eval(), (torch.randn(1, 3, size, size),)


def tester(flow: str, model, inputs):
    if flow == "coreai":
        from backend_suite.flows import CoreAITester

        return CoreAITester(model, inputs)
    from executorch.backends.xnnpack.test.tester import Tester as XnnpackTester

    return XnnpackTester(model, inputs)


def snr_db(reference, actual) -> float:
    import torch

    noise = (reference.double() - actual.double()).pow(2).mean()
    return float("inf") if noise == 0 else float(10 * torch.log10(reference.double().pow(2).mean() / noise))


def measure(name: str, flow: str, runs: int) -> dict:
    """One row, in this process."""
    import torch
    from executorch.exir.delegate import executorch_call_delegate

    from memory_profile import Profile

    torch.set_num_threads(2)
    profile = Profile()
    with profile.phase("build the model"):
        model, inputs = build(name)
        with torch.no_grad():
            expected = model(*inputs)
    row: dict = {"model": name, "flow": flow}
    if flow in QUANTIZED_FLOWS:
        keep_float = KEEP_FLOAT.get(name.removesuffix("_random_head"), [])
        edge, pte = quantized_lowering(profile, flow.removeprefix("coreai-"), model, inputs, keep_float)
    else:
        with profile.phase("torch.export"):
            t = tester(flow, model, inputs)
            t.export()
        with profile.phase("to_edge_transform_and_lower"):
            t.to_edge_transform_and_lower()
        edge = t.get_artifact()
    graph = edge.exported_program().graph
    calls = [n for n in graph.nodes if n.op == "call_function"]
    row["delegates"] = sum(n.target is executorch_call_delegate for n in calls)
    row["outside"] = sorted({getattr(n.target, "__name__", str(n.target)) for n in calls if n.target is not executorch_call_delegate and "getitem" not in str(n.target)})
    row["nodes_outside"] = sum(n.target is not executorch_call_delegate and "getitem" not in str(n.target) for n in calls)
    if flow not in QUANTIZED_FLOWS:
        with profile.phase("to_executorch + serialize"):
            t.to_executorch()
            t.serialize()
        pte = t.get_artifact()
    row["pte_mb"] = len(pte) / 1e6
    from executorch.runtime import Runtime

    if flow.startswith("coreai"):
        from coreai_partitioner import load_runtime_backend

        load_runtime_backend()
    with profile.phase("load in ExecuTorch's runtime"):
        program = Runtime.get().load_program(pte)  # held: a Method does not keep its Program alive
        method = program.load_method("forward")
    with profile.phase("run"):
        actual = method.execute(list(inputs))[0]
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            method.execute(list(inputs))
            times.append(time.perf_counter() - started)
    row["run_ms"] = 1000 * statistics.median(times)
    row["snr_db"] = snr_db(expected, actual)
    row["phases"] = {span.label: {"s": round(span.end, 2), "peak_gb": round(span.peak / 2**30, 2)} for span in profile.spans()}
    row["peak_gb"] = round(profile.peak / 2**30, 2)
    return row


def quantized_lowering(profile, scheme: str, model, inputs, keep_float: list[str]) -> tuple:
    """``lower(model, inputs, quantize=scheme)`` in its two steps, then the ``.pte``'s bytes: ``(edge program, bytes)``."""
    from coreai_partitioner import lower_exported
    from coreai_partitioner.lowering.lower import export_with_composites

    with profile.phase("torch.export"):
        exported = export_with_composites(model, inputs, quantize=scheme, keep_float=keep_float)
    with profile.phase("to_edge_transform_and_lower"):
        edge = lower_exported(exported)
    with profile.phase("to_executorch + serialize"):
        pte = bytes(edge.to_executorch().buffer)
    return edge, pte


def run_row(name: str, flow: str, runs: int, timeout: int) -> dict:
    """One row in a process of its own: a crash or a time-out is the row's result, not the benchmark's end."""
    from backend_suite import environment

    command = [sys.executable, __file__, "--row", name, flow, "--runs", str(runs)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment())
    except subprocess.TimeoutExpired:
        return {"model": name, "flow": flow, "error": f"timed out after {timeout} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (done.stderr.strip().splitlines() or [""])[-1][:300]
    return {"model": name, "flow": flow, "error": f"exit {done.returncode}: {tail}"}


def report(rows: list[dict]) -> str:
    header = ["model", "flow", "export s", "lower s", "export + lower s", "to_executorch s", "peak RSS GB", ".pte MB",
              "delegates", "nodes outside", "run ms", "SNR dB"]
    lines = []
    for row in rows:
        if "error" in row:
            lines.append([row["model"], row["flow"]] + ["-"] * 9 + [row["error"]])
            continue
        phases = row["phases"]
        lines.append([
            row["model"], row["flow"], f"{phases['torch.export']['s']:.1f}", f"{phases['to_edge_transform_and_lower']['s']:.1f}",
            f"{phases['torch.export']['s'] + phases['to_edge_transform_and_lower']['s']:.1f}",
            f"{phases['to_executorch + serialize']['s']:.1f}", f"{row['peak_gb']:.2f}", f"{row['pte_mb']:.1f}",
            str(row["delegates"]), str(row["nodes_outside"]), f"{row['run_ms']:.0f}", f"{row['snr_db']:.0f}",
        ])
    widths = [max(len(str(r[i])) for r in [header] + lines) for i in range(len(header))]
    fmt = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    text = [fmt(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [fmt(r) for r in lines]
    outside = [f"  {r['model']} ({r['flow']}): {', '.join(_op_name(op) for op in r['outside'])}" for r in rows if r.get("outside")]
    if outside:
        text += ["", "ops outside the delegates"] + outside
    return "\n".join(text)


def _op_name(text: str) -> str:
    """``aten.mean.dim`` from an edge op's name or its printed form (``<EdgeOpOverload: aten.mean.dim>: schema = ...``)."""
    return text.removeprefix("<EdgeOpOverload: ").split(">", 1)[0]


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows if "error" not in r})
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.35 * len(models) + 1.5), sharey=True)
    for axis, key, label in ((axes[0], "lower", "lowering time (s)"), (axes[1], "run_ms", "run time on this machine (ms)")):
        for offset, flow in ((-0.2, "coreai"), (0.2, "xnnpack")):
            values = []
            for model in models:
                row = next((r for r in rows if r["model"] == model and r["flow"] == flow and "error" not in r), None)
                values.append(0 if row is None else (row["phases"]["to_edge_transform_and_lower"]["s"] if key == "lower" else row["run_ms"]))
            axis.barh([i + offset for i in range(len(models))], values, height=0.4, label=flow)
        axis.set_xlabel(label)
        axis.set_xscale("log")
    axes[0].set_yticks(range(len(models)), models)
    axes[0].legend()
    fig.suptitle("torchvision models: coreai and xnnpack flows (coreai-core's Linux CPU runtime, 2 cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--flows", nargs="+", choices=[*FLOWS, *QUANTIZED_FLOWS],
                        help=f"default: {', '.join(FLOWS)}, and {', '.join(QUANTIZED_FLOWS)} for {', '.join(QUANTIZED_MODELS)}")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds one row may take")
    parser.add_argument("--row", nargs=2, metavar=("MODEL", "FLOW"), help=argparse.SUPPRESS)
    parser.add_argument("--load", type=Path)
    parser.add_argument("--name", default="vision_models")
    args = parser.parse_args()
    if args.row:
        import warnings

        warnings.filterwarnings("ignore")
        print(json.dumps(measure(*args.row, args.runs)))
        return
    if args.load:
        print(report(json.loads(args.load.read_text())["rows"]))
        return
    rows = []
    RESULTS.mkdir(exist_ok=True)
    for name in args.models:
        flows = args.flows or [*FLOWS[:1], *(QUANTIZED_FLOWS if name in QUANTIZED_MODELS else ()), *FLOWS[1:]]
        for flow in flows:
            rows.append(run_row(name, flow, args.runs, args.timeout))
            print(report(rows[-1:]).splitlines()[-1], flush=True)
            # written after every row: a run stopped early keeps what it measured
            (RESULTS / f"{args.name}.json").write_text(json.dumps({"runs": args.runs, "rows": rows}, indent=1) + "\n")
            (RESULTS / f"{args.name}.txt").write_text(report(rows) + "\n")
    plot(rows, RESULTS / f"{args.name}.png")
    print(report(rows))


if __name__ == "__main__":
    main()
