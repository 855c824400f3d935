"""One torchvision model through the coreai flow's own tester, in a process of its own (torchvision's folder on
its path: :func:`backend_suite.environment`).

    python -m backend_suite.models mobilenet_v2 --size 96

A ViT (``vit_b_16``) is built for ``size`` x ``size`` images with a drawn head.
``swin_v2_block`` is one shifted ``SwinTransformerBlockV2`` (``size`` x ``size``
tokens of width 32).  Prints one JSON line: the ops left outside the delegates, how many delegates,
and the SNR of the ``.pte``'s output (ExecuTorch's runtime, Core AI delegates
on this machine's runtime) against eager.  Random weights, as the suite
builds them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings

from backend_suite import environment


def check(name: str, size: int) -> dict:
    import torch

    import backend_suite.torchvision_ops  # noqa: F401  (torchvision's operator schemas, before torchvision)
    import torchvision
    from executorch.exir.delegate import executorch_call_delegate
    from executorch.runtime import Runtime

    from backend_suite.flows import CoreAITester
    from coreai_partitioner.verify.describe import outside_delegates

    torch.manual_seed(0)
    if name == "swin_v2_block":
        # a shifted SwinTransformerBlockV2: its rank-0 constants (the 16 of 16 * sigmoid(bias)) go into the delegate
        # with their data, never as rank-0 inputs, which trap the runtime (claims/scalars.py)
        model = torchvision.models.swin_transformer.SwinTransformerBlockV2(32, 2, window_size=[4, 4], shift_size=[2, 2])
        sample = (torch.randn(1, size, size, 32),)
    elif name.startswith("vit_"):
        # a ViT takes one image size, its position table's: built at ``size``; its head drawn (torchvision zeroes it,
        # and an all-zero output would match anything)
        model = getattr(torchvision.models, name)(image_size=size)
        torch.nn.init.normal_(model.heads.head.weight, std=0.02)
        sample = (torch.randn(1, 3, size, size),)
    else:
        model = getattr(torchvision.models, name)()
        sample = (torch.randn(1, 3, size, size),)
    model.eval()
    tester = CoreAITester(model, sample)
    tester.export().to_edge_transform_and_lower()
    edge = tester.get_artifact()
    graph = edge.exported_program().graph
    delegates = sum(node.target is executorch_call_delegate for node in graph.nodes if node.op == "call_function")
    tester.to_executorch().serialize()
    program = Runtime.get().load_program(tester.get_artifact())  # held: a Method does not keep its Program alive
    actual = program.load_method("forward").execute(list(sample))[0]
    with torch.no_grad():
        expected = model(*sample)
    noise = (expected.double() - actual.double()).pow(2).mean()
    snr = float(10 * torch.log10(expected.double().pow(2).mean() / noise)) if noise > 0 else float("inf")
    return {"outside": dict(outside_delegates(edge)["forward"]), "delegates": delegates, "snr_db": snr}


def run(name: str, size: int) -> dict:
    """:func:`check` in a new process; raises with its output when it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "backend_suite.models", name, "--size", str(size)],
        env=environment(), capture_output=True, text=True,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{name} (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--size", type=int, default=224)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(json.dumps(check(args.name, args.size)))
