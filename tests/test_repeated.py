"""Layers alike traced once and repeated in the graph (coreai_partitioner.lowering.repeated)."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from coreai_partitioner.lowering import repeated
from coreai_partitioner.lowering.lower import export_with_composites
from coreai_partitioner.lowering.whole_program import decomposition_table
from coreai_torch.composite_ops import RMSNorm


class Layer(torch.nn.Module):
    """A composite, a projection and a state the layer writes, over what every layer shares (``shared``)."""

    def __init__(self, dim: int, path: str) -> None:
        super().__init__()
        self.norm = RMSNorm(dim)
        self.proj = torch.nn.Linear(dim, dim, bias=False)
        self.path = path  # names the layer, as a decoder's blocks do for messages
        self.register_buffer("state", torch.zeros(dim), persistent=False)

    def forward(self, x: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
        y = x + torch.relu(self.norm(self.proj(self.norm(x)))) * shared  # two call sites of one op
        self.state.copy_(y.mean((0, 1)))
        return y


class Stack(torch.nn.Module):
    def __init__(self, layers: int = 7, dim: int = 16, index_read: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList([Layer(dim, f"model.layers.{i}") for i in range(layers)])
        self.head = torch.nn.Linear(dim, 4)
        self.index_read = index_read
        self.before = None  # (index, x) -> x: what the code around the stack does before a layer
        self.tail_reads = None  # a layer whose output what follows the layers reads too

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(x.sum(-1, keepdim=True))  # made once, read by every layer
        kept = None
        for index, layer in enumerate(self.layers):
            x = layer(x * (index + 1) if self.index_read else x, shared)
            x = self.before(index, x) if self.before is not None else x
            kept = x if index == self.tail_reads else kept
        return self.head(x[:, -1] if kept is None else x[:, -1] + kept[:, -1])


def export(model: torch.nn.Module, path: str | None = "layers"):
    x = torch.randn(1, 5, 16)
    T = torch.export.Dim("T", min=1, max=8)
    return export_with_composites(
        model, (x,), dynamic_shapes=({1: T},), decompositions=decomposition_table(), repeated=path,
    )


def structure(program) -> tuple:
    """The program as the lowering reads it: each node's op, target (call sites by module) and inputs, by position;
    the names of its inputs and outputs (a delegate's are named after them); the signature; the weights and state
    by name, in order."""
    nodes = list(program.graph.nodes)
    at = {node: i for i, node in enumerate(nodes)}

    def arg(value):
        if isinstance(value, torch.fx.Node):
            return ("node", at[value])
        if isinstance(value, (list, tuple)):
            return tuple(arg(v) for v in value)
        if isinstance(value, dict):
            return tuple((k, arg(v)) for k, v in value.items())
        return repr(value)

    def plain(text):  # a call site's op and node name carry a suffix of their export's own
        return re.sub(r"_[0-9a-f]{8}\b", "", text)

    signature = program.graph_signature
    return (
        [(node.op, plain(str(node.target)), arg(node.args), arg(node.kwargs),
          str(getattr(node.meta.get("val"), "shape", None))) for node in nodes],
        [node.name for node in nodes if node.op == "placeholder" or node in program.graph.output_node().args[0]],
        [(spec.kind, spec.target, at[program.graph.find_nodes(op="placeholder", target=spec.arg.name)[0]])
         for spec in signature.input_specs],
        [(spec.kind, spec.target) for spec in signature.output_specs],
        list(program.state_dict),
        list(program.constants),
    )


def traced_layers(caplog) -> str:
    return " ".join(record.getMessage() for record in caplog.records if record.name == repeated.__name__)


def test_layers_alike_are_traced_once_and_repeated_into_the_whole_traces_program(caplog):
    model = Stack().eval()
    with caplog.at_level(logging.INFO, logger=repeated.__name__):
        program, records = export(model)
    assert "traced 4 of the 7 layers of layers and repeated the last" in traced_layers(caplog)
    whole, whole_records = export(model, path=None)
    assert structure(program) == structure(whole)
    assert records.module_paths() == whole_records.module_paths() == [f"layers.{i}.norm.rmsnorm_impl" for i in range(7) for _ in "ab"]
    x = torch.randn(1, 3, 16)
    module = program.module()
    torch.testing.assert_close(module(x), model(x))
    torch.testing.assert_close(dict(module.named_buffers())["layers.6.state"], model.layers[6].state)  # written


@pytest.mark.slow  # two traces each (the fast layer's: the layers alike, above)
@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda model: setattr(model.layers[5], "extra", 2.0), "layer 5 differs from layer 3"),
        (lambda model: setattr(model, "index_read", True), "layer 3 takes"),
        (lambda model: model.layers[6].register_forward_hook(lambda *args: None), "a hook on layer 6"),
    ],
    ids=["attribute", "index-read", "hook"],
)
def test_layers_not_shown_alike_are_traced_whole_saying_why(caplog, change, reason):
    model = Stack().eval()
    change(model)
    with caplog.at_level(logging.INFO, logger=repeated.__name__):
        program, _ = export(model)
    assert "traced all 7 layers of layers" in traced_layers(caplog) and reason in traced_layers(caplog)
    x = torch.randn(1, 3, 16)
    torch.testing.assert_close(program.module()(x), model(x))


@pytest.mark.slow
def test_a_stack_no_longer_than_the_layers_traced_is_traced_whole(caplog):
    model = Stack(layers=repeated.TRACED).eval()
    with caplog.at_level(logging.INFO, logger=repeated.__name__):
        export(model)
    assert traced_layers(caplog) == ""


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    # CI: the host form; the device form and int4 in the tier
    [{}, pytest.param({"target": "device"}, marks=pytest.mark.benchmark), pytest.param({"quantize": "int4"}, marks=pytest.mark.benchmark)],
    ids=["host", "device", "int4"],
)
def test_a_decoder_whose_layers_are_repeated_lowers_to_the_same_pte_byte_for_byte(monkeypatch, caplog, options):
    import transformers

    from coreai_partitioner import text_generation

    config = text_generation.tiny_config("qwen3")
    config.num_hidden_layers, config.layer_types = 6, ["full_attention"] * 6
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    shapes = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=8)
    with caplog.at_level(logging.INFO, logger=repeated.__name__):
        pte = bytes(text_generation.lower_decoder(model, shapes, **options).to_executorch().buffer)
    assert "traced 4 of the 6 layers" in traced_layers(caplog)
    monkeypatch.setattr(repeated, "TRACED", 6)  # every layer traced
    assert pte == bytes(text_generation.lower_decoder(model, shapes, **options).to_executorch().buffer)


@pytest.mark.slow
def test_call_sites_are_named_after_their_layer_whatever_the_exports_suffix(monkeypatch, caplog):
    """A call site's op is its module's path and a suffix of the export's own, which fx reads as a number when it is
    all digits: a second call site of the op is then ``..._3807018``, not ``..._03807017_1``.  Each repeated layer's
    call sites are named as the whole trace names them."""
    import uuid

    from coreai_torch import externalize as marked

    monkeypatch.setattr(marked, "uuid4", lambda: uuid.UUID(int=0x03807017 << 96))

    def call_sites(program):
        return [node.name for node in program.graph.nodes if node.op == "call_function" and "_norm_" in node.name]

    model = Stack().eval()
    with caplog.at_level(logging.INFO, logger=repeated.__name__):
        program, _ = export(model)
    assert "repeated the last" in traced_layers(caplog)
    assert call_sites(program) == call_sites(export(model, path=None)[0])
    assert call_sites(program)[-2:] == ["layers_6_norm_rmsnorm_impl_03807017", "layers_6_norm_rmsnorm_impl_3807018"]


def _constant_input(model: Stack) -> None:
    model.table = torch.ones(16)  # a tensor that is no parameter or buffer: a lifted constant
    model.before = lambda index, x: x * model.table


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda model: setattr(model.layers[5], "thing", object()), "an attribute of type object"),
        (lambda model: setattr(model.layers[4], "proj", torch.nn.Linear(16, 16, bias=True)), "layer 4 differs from layer 3"),
        (lambda model: setattr(model, "tail_reads", 1), "what follows the layers reads"),
        (_constant_input, "an input of kind CONSTANT_TENSOR"),
        # After layer 2, so in layer 3's region.  After layer 3 it would be what follows the traced layers, which
        # trace_repeated cannot tell from the code after the stack: code around the stack treats every layer alike.
        (lambda model: setattr(model, "before", lambda i, x: torch.relu(x) if i == 2 else torch.tanh(x)), "layer 3 calls"),
        (lambda model: setattr(model, "before", lambda i, x: x * 2 if i == 2 else x), "the last layers traced make"),
    ],
    ids=["attribute-type", "weight-shapes", "tail-reads-an-earlier-layer", "constant-input", "other-op", "other-node-count"],
)
def test_each_reason_to_trace_whole_is_said_and_the_whole_trace_runs_as_the_model(caplog, change, reason):
    """More of the reasons the layers are not shown alike, each named in the log (module docstring of
    lowering/repeated.py); the program traced whole computes what the model does."""
    model = Stack().eval()
    change(model)
    with caplog.at_level(logging.INFO, logger=repeated.__name__):
        program, _ = export(model)
    said = traced_layers(caplog)
    assert "traced all 7 layers of layers" in said and reason in said, said
    x = torch.randn(1, 3, 16)
    torch.testing.assert_close(program.module()(x), model(x))
