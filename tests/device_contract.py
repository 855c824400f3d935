"""What upstream's on-device Core AI runtime requires of every delegate of a ``.pte``, read off the ``.pte`` itself.

Each task's device form (the LLM's, the vision-language model's, Whisper's)
asserts these, then what its own shapes add (which arguments are
bounded-dynamic, and by what).
"""

from __future__ import annotations

from upstream_manifest import check_named_data, parse_manifest

from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte


def device_delegate_arguments(path, methods) -> dict[str, list]:
    """Assert the device runtime's contract for ``methods`` of the ``.pte`` at ``path``: one delegate per method,
    all ``CoreAIBackend``, inline, its function the method's, upstream's manifest rules, nothing hidden as state,
    fp16/fp32 tensors in the default dim order, one asset.  Returns each method's delegate call arguments."""
    pte = read_pte(path)
    assert set(methods) <= set(pte.methods)
    delegates = [d for d in pte.delegates if d.method in methods]
    assert sorted(d.method for d in delegates) == sorted(methods)  # one delegate per method
    assert {d.backend_id for d in pte.delegates} == {"CoreAIBackend"}
    found = {}
    for delegate in delegates:
        manifest = parse_manifest(delegate.payload)  # every rule of upstream's parse_manifest
        check_named_data(manifest, delegate.files)
        assert manifest["packaging"] == "inline"
        assert manifest["function"] == delegate.method
        assert manifest.get("runtime_supported", True) is True and "initial_state" not in manifest
        (call,) = [c for c in pte.plans[delegate.method].delegate_calls if c.delegate_index == delegate.index]
        arguments = pte.plans[delegate.method].arguments(call)
        # Nothing hidden as state: the function's inputs and outputs are exactly what the call passes.
        assert len(arguments) == len(manifest["input_names"]) + len(manifest["output_names"])
        for argument in arguments:
            assert argument.kind == "Tensor" and argument.dtype in ("HALF", "FLOAT"), argument
            assert argument.dim_order == tuple(range(len(argument.sizes))), argument
        found[delegate.method] = arguments
    assert len({d.manifest["hash"] for d in delegates}) == 1  # one asset: its weights stored once
    return found
