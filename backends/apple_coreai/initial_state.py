"""Initial values of the mutable buffers a Core AI delegate owns, shipped with its asset.

A delegate that took over a mutable buffer (``take_over_mutable_buffer``, e.g.
a KV cache) keeps it as Core AI state, and the asset declares the state's
shape but not its value: a runtime starts it at zero.  A buffer that starts
anywhere else ships its value beside the asset's bundle, in the ``.pte``'s
named data (``coreai/<hash>/initial_state/<digest>.bin``) or in the sidecar's
``<hash>/`` directory, outside the bundle's ``files`` and ``bundle_digests``
(which cover the bundle alone, as upstream's runtime requires).  The manifest
says which file is which state, and its SHA-256:

    "initial_state": {"<state name>": {"file": "initial_state/<digest>.bin", "sha256": "<hex>",
                                       "dtype": "float32", "shape": [1, 6, 8]}}

The state name is the buffer's placeholder in the delegate's graph, which is
the name the converter gives the Core AI state.  All-zero buffers ship
nothing, so programs whose state starts at zero keep their bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

DIRECTORY = "initial_state"

_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


def delegate_owned_buffers(edge_program: ExportedProgram) -> dict[str, tuple[str, torch.Tensor | None]]:
    """The delegate's mutated buffers: ``{state name: (buffer fqn, value or None)}``."""
    signature = edge_program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    owned = {}
    for spec in signature.input_specs:
        if spec.target in mutated:
            value = edge_program.state_dict.get(spec.target, edge_program.constants.get(spec.target))
            owned[spec.arg.name] = (spec.target, value)
    return owned


def stage_initial_state(edge_program: ExportedProgram, staging: Path) -> dict[str, Any]:
    """Write the non-zero initial values of the delegate's state under ``staging``.

    Returns the manifest fields to add (``{}`` when every state starts at zero).
    """
    entries = {}
    for name, (target, value) in sorted(delegate_owned_buffers(edge_program).items()):
        if value is None:
            raise ValueError(
                f"the Core AI delegate owns buffer '{target}' but the program holds no value for it, so a "
                "runtime would start it at zero; register it with register_buffer(..., persistent=True) or "
                "lower with take_over_mutable_buffer=False"
            )
        value = value.detach().cpu().contiguous()
        if not bool(value.any()):
            continue
        if value.dtype not in _DTYPE_NAMES:
            raise ValueError(
                f"buffer '{target}' of dtype {value.dtype} cannot ship as Core AI state; lower with "
                "take_over_mutable_buffer=False"
            )
        data = value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b""
        digest = hashlib.sha256(data).hexdigest()
        relative = f"{DIRECTORY}/{digest[:32]}.bin"
        path = staging / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        entries[name] = {"file": relative, "sha256": digest, "dtype": _DTYPE_NAMES[value.dtype], "shape": list(value.shape)}
    return {"initial_state": entries} if entries else {}
