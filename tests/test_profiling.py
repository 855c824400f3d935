"""ETRecord, debug handles and ETDump profiling of Core AI delegates, read back with ExecuTorch's Inspector."""

from __future__ import annotations

import json

import pytest
import torch
import torch.fx as fx
from helpers import TwoNorms, seeded

from coreai_partitioner import load_runtime_backend, lower, save_pte
from coreai_partitioner.backends.apple_coreai.debug_handles import debug_handle_map
from coreai_partitioner.backends.apple_coreai.runtime import profiling


def tagged(value):
    """A value in coreai-core's tagged debug-info JSON."""
    if isinstance(value, str):
        return {"string": {"_0": value}}
    if isinstance(value, int):
        return {"integer": {"_0": value}}
    if isinstance(value, list):
        return {"array": {"_0": [tagged(v) for v in value]}}
    return {"dictionary": {"_0": {k: tagged(v) for k, v in value.items()}}}


def operation(odix_id: int, *sources: tuple[str, list[str]]) -> dict:
    metadatas = []
    for name, stack in sources:
        metadatas += [
            {"key": "sources", "value": tagged([{"identifiers": [name], "id": 1, "name": "torch"}])},
            {"key": "op_id", "value": tagged({"type": "torch", "value": 1})},
            {"key": "call_stack", "value": tagged(stack)},
        ]
    return {"odixId": odix_id, "name": f"odix_{odix_id}", "sourceLocations": [], "metadatas": metadatas}


def test_each_ops_source_is_its_outermost_node_and_ops_without_sources_have_none():
    infos = [{"identifier": "odix_op_id", "operations": [
        operation(7, ("mul", ["RMSNormImpl$1"]), ("call_n1_0", ["RMSNormImpl$1", "RMSNorm$1", "Model$1"])),
        operation(8, ("aten_addmm_default", ["Linear$1", "Model$1"]), ("aten_view_copy_default", ["Linear$1", "Model$1"])),
        operation(9),
    ]}]
    assert profiling.op_sources(json.dumps(infos).encode()) == {7: "call_n1_0", 8: "aten_addmm_default"}


def test_node_spans_run_from_a_nodes_first_op_to_its_last_and_drop_ops_of_no_node():
    sources = {1: "call_n1_0", 2: "call_n1_0", 3: "aten_addmm_default"}
    intervals = [(1, 100, 110), (99, 105, 200), (2, 120, 130), (3, 140, 150)]
    assert profiling.node_spans(intervals, sources) == [("call_n1_0", 100, 130), ("aten_addmm_default", 140, 150)]


def test_debug_handle_map_covers_the_whole_call_and_each_node_with_a_handle():
    graph = fx.Graph()
    x = graph.placeholder("x")
    first = graph.call_function(torch.ops.aten.relu.default, (x,), name="call_n1_0")
    second = graph.call_function(torch.ops.aten.neg.default, (first,), name="aten_neg_default")
    unmarked = graph.call_function(torch.ops.aten.abs.default, (second,), name="aten_abs_default")
    graph.output(unmarked)
    first.meta["debug_handle"], second.meta["debug_handle"] = 1, 2
    assert debug_handle_map(graph, "main") == {"coreai:main": (1, 2), "call_n1_0": (1,), "aten_neg_default": (2,)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A two-composite model lowered with an ETRecord and full debug locations, its .pte and .etrecord."""
    directory = tmp_path_factory.mktemp("profiled")
    model = seeded(TwoNorms())
    x = torch.randn(2, 4, 16)
    program = lower(model, (x,), generate_etrecord=True, debug_info="full").to_executorch()
    save_pte(program, directory / "model.pte")
    program.get_etrecord().save(str(directory / "model.etrecord"))
    return model, x, directory, program.get_etrecord()


@pytest.mark.slow
def test_lower_with_generate_etrecord_gives_executorchs_etrecord_mapping_the_delegate(exported):
    from executorch.devtools.etrecord import parse_etrecord

    _, _, directory, etrecord = exported
    (delegate,) = etrecord._delegate_map["forward"].values()
    assert delegate["name"] == "CoreAICompositeBackend"
    mapping = delegate["delegate_map"]
    assert {"call_n1_rmsnorm_impl_0", "call_n2_rmsnorm_impl_0", "aten_addmm_default"} <= set(mapping)
    assert set(mapping["coreai:main"]) == {h for key, handles in mapping.items() if key != "coreai:main" for h in handles}
    parsed = parse_etrecord(str(directory / "model.etrecord"))
    assert list(parsed._delegate_map["forward"].values())[0]["delegate_map"].keys() == mapping.keys()


def inspect(directory, etdump):
    import warnings

    from executorch.devtools import Inspector

    with warnings.catch_warnings():  # no debug buffer was asked for, so no intermediate tensors
        warnings.filterwarnings("ignore", message="Output Buffer not found")
        events = Inspector(etdump_path=str(etdump), etrecord=str(directory / "model.etrecord")).event_blocks
    return {event.name: event for block in events if block.name == "Execute" for event in block.events}


@pytest.mark.slow
def test_an_etdump_shows_each_delegate_call_by_name_with_its_debug_handles(exported):
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    model, x, directory, etrecord = exported
    load_runtime_backend()
    module = _load_for_executorch(str(directory / "model.pte"), enable_etdump=True, debug_buffer_size=0)
    for _ in range(3):
        (out,) = module.forward((x,))
    torch.testing.assert_close(out, model(x).detach(), rtol=1e-4, atol=1e-5)
    module.write_etdump_result_to_file(str(directory / "pybindings.etdp"))

    events = inspect(directory, directory / "pybindings.etdp")
    call = events["coreai:main"]
    assert call.is_delegated_op and call.delegate_backend_name == "CoreAICompositeBackend"
    mapping = list(etrecord._delegate_map["forward"].values())[0]["delegate_map"]
    assert tuple(call.debug_handles) == tuple(mapping["coreai:main"])
    assert len(call.perf_data.raw) == 3


@pytest.mark.slow
def test_with_full_debug_info_each_composite_call_site_is_an_event_inside_its_delegate_call(exported):
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc
    from executorch.runtime import Runtime

    model, x, directory, etrecord = exported
    load_runtime_backend()
    program = Runtime.get().load_program(directory / "model.pte", enable_etdump=True)
    program.load_method("forward").execute([x])
    program.write_etdump_result_to_file(str(directory / "runtime.etdp"), str(directory / "runtime.debug"))

    events = inspect(directory, directory / "runtime.etdp")
    mapping = list(etrecord._delegate_map["forward"].values())[0]["delegate_map"]
    for call_site in ("call_n1_rmsnorm_impl_0", "call_n2_rmsnorm_impl_0"):
        event = events[call_site]
        assert event.is_delegated_op and tuple(event.debug_handles) == tuple(mapping[call_site])
        assert event.perf_data.raw[0] < events["coreai:main"].perf_data.raw[0]

    run = deserialize_from_etdump_flatcc((directory / "runtime.etdp").read_bytes()).run_data[-1]
    spans = {e.profile_event.delegate_debug_id_str: e.profile_event for e in run.events if e.profile_event}
    spans = {name: span for name, span in spans.items() if name}  # the delegate's own events
    whole = spans.pop("coreai:main")
    assert spans and all(whole.start_time <= s.start_time <= s.end_time <= whole.end_time for s in spans.values())
