"""A stack of layers that trace alike, traced in part and repeated in the graph.

``torch.export`` costs a decoder about a third of a second a layer (the
forward runs twice, on fake tensors with a symbolic ``T``), the same work
for every layer.  :func:`trace_repeated` traces the first :data:`TRACED`
layers of the stack only and writes the rest into the graph as copies of
the last one traced, each over its own layer's weights, state and
call-site ops: the program is the one the whole trace makes, node for node,
each node named as the whole trace names it but for a few names torch gives
after the trace, counting what it made and dropped (a size read,
``sym_size_int_15``); names reach the ``.pte`` only as a delegate's inputs
and outputs, and the ``.pte`` is the same byte for byte
(``tests/test_repeated.py``).

It repeats only what it has shown alike, and traces the whole model otherwise:

- every later layer has the last traced layer's structure: classes,
  attributes (a string naming the layer's own index in a path aside),
  parameter and buffer shapes and dtypes, no hooks;
- the last traced layer's graph is the one before it, node for node, with
  each layer's own weights, state and ops, over the layer before's output;
  what it reads from further back is what every layer shares (a mask, a
  RoPE table), made from no layer's weights or state;
- what follows the layers reads only the last one's values, and the shared ones;
- every input is a parameter, a buffer or the user's, and every output
  the user's or a buffer's new value.

So a stack whose layers differ by index alone (a graph break every few
layers, a layer's input sliced by its index) traces whole.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import logging
import re
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)

from coreai_partitioner import _compat
from coreai_partitioner.records.subexport import Unalike, structure_key

logger = logging.getLogger(__name__)

#: Layers traced before the rest are repeated.  The last two show the step
#: from one layer to the next; the one before them that the step reads only
#: its previous layer; the first may make what all later layers share.
TRACED = 4


class NotRepeatable(Exception):
    """The layers cannot be shown to trace alike: the model is traced whole."""


def trace_repeated(model: nn.Module, path: str, trace: Callable[[nn.Module], ExportedProgram]) -> ExportedProgram:
    """``trace(model)``'s program, tracing only the first :data:`TRACED` layers of ``model.<path>`` (a ``ModuleList``).

    The code around the stack must treat every layer alike: a layer's index
    read outside it (a graph break every few layers) is more than this can
    see past the traced layers.  Falls back to ``trace(model)`` whole where
    the layers are not shown alike (module docstring), saying why in the log.
    """
    layers = model.get_submodule(path)
    if not isinstance(layers, nn.ModuleList) or len(layers) <= TRACED:
        return trace(model)
    reason = _unlike_layers(layers)
    if reason is None:
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        setattr(parent, name, nn.ModuleList(list(layers)[:TRACED]))
        try:
            program = trace(model)
        finally:
            setattr(parent, name, layers)
        try:
            repeated = _Repeat(program, model, path, len(layers)).program()
        except NotRepeatable as error:
            reason = str(error)
        else:
            logger.info("traced %d of the %d layers of %s and repeated the last", TRACED, len(layers), path)
            return repeated
    logger.info("traced all %d layers of %s: %s", len(layers), path, reason)
    return trace(model)


# ---------------------------------------------------------------- which layers are alike

_SIMPLE = (type(None), bool, int, float, complex, bytes, enum.Enum, torch.dtype, torch.device, torch.Size)


def _unlike_layers(layers: nn.ModuleList) -> str | None:
    """Why the layers after the traced ones may trace otherwise than the last traced one, or None."""
    try:
        key = _layer_key(layers[TRACED - 1], TRACED - 1)
        for index in range(TRACED, len(layers)):
            if _layer_key(layers[index], index) != key:
                return f"layer {index} differs from layer {TRACED - 1}"
    except NotRepeatable as error:
        return str(error)
    return None


def _layer_key(layer: nn.Module, index: int) -> tuple:
    """What can change how ``layer`` (layer ``index``) traces: its modules' classes, attributes, weights' shapes
    (:func:`~coreai_partitioner.records.subexport.structure_key`, attributes keyed by :func:`_value_key`)."""
    try:
        return structure_key(layer, lambda value: _value_key(value, index), where=f"layer {index}")
    except Unalike as error:
        raise NotRepeatable(str(error)) from error


def _value_key(value: Any, index: int) -> Any:
    """What of an attribute's ``value`` can change a trace (layer ``index``'s own index left out of a string)."""
    if isinstance(value, str):  # a path naming the layer, for messages: its own index left out
        return (str, re.sub(rf"(?<=\.){index}(?=\.|$)", "#", value))
    if isinstance(value, _SIMPLE) or isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
        return (type(value), value)
    if isinstance(value, (tuple, list, frozenset)):
        return (type(value), tuple(_value_key(v, index) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((_value_key(k, index), _value_key(v, index)) for k, v in value.items()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value), tuple((f.name, _value_key(getattr(value, f.name), index)) for f in dataclasses.fields(value)))
    raise NotRepeatable(f"an attribute of type {type(value).__name__}")


# ---------------------------------------------------------------- the graph


class _Repeat:
    """The program of ``count`` layers from ``program``, the trace of the first :data:`TRACED`."""

    def __init__(self, program: ExportedProgram, model: nn.Module, path: str, count: int) -> None:
        self.source, self.model, self.path, self.count = program, model, path, count
        self.prefix = f"{path}."
        graph = program.graph
        self.placeholders = {node.name: node for node in graph.nodes if node.op == "placeholder"}
        self.spec_of = {spec.arg.name: spec for spec in program.graph_signature.input_specs}
        for spec in program.graph_signature.input_specs:
            if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.USER_INPUT):
                raise NotRepeatable(f"an input of kind {spec.kind.name} ({spec.arg.name})")
        for spec in program.graph_signature.output_specs:
            if spec.kind not in (OutputKind.BUFFER_MUTATION, OutputKind.USER_OUTPUT):
                raise NotRepeatable(f"an output of kind {spec.kind.name}")
        self._split(graph)
        self.per_layer = self._per_layer(graph)
        self.ops = self._call_site_ops()
        self._check()

    # -- reading the traced program

    def layer_input(self, node: fx.Node) -> tuple[int, str] | None:
        """``(layer, name in the layer)`` of a placeholder of one layer's parameter or buffer."""
        spec = self.spec_of.get(node.name) if node.op == "placeholder" else None
        if spec is None or spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER) or not spec.target.startswith(self.prefix):
            return None
        index, _, rest = spec.target[len(self.prefix):].partition(".")
        return int(index), rest

    def _split(self, graph: fx.Graph) -> None:
        """The layers' regions (each from after the one before's last node to its own last) and the tail."""
        nodes = [node for node in graph.nodes if node.op not in ("placeholder", "output")]
        pattern = re.compile(rf"^{re.escape(self.path)}\.(\d+)$")
        last: dict[int, int] = {}
        seen = -1
        for position, node in enumerate(nodes):
            for module_path, _ in (node.meta.get("nn_module_stack") or {}).values():
                match = pattern.match(module_path)
                if match:
                    index = int(match.group(1))
                    if index < seen:
                        raise NotRepeatable(f"node {node.name} of layer {index} after layer {seen}'s")
                    seen, last[index] = index, position
                    break
        if sorted(last) != list(range(TRACED)):
            raise NotRepeatable(f"the graph holds layers {sorted(last)}")
        bounds = [-1, *(last[index] for index in range(TRACED))]
        self.regions = [nodes[bounds[k] + 1: bounds[k + 1] + 1] for k in range(TRACED)]
        self.tail = nodes[bounds[-1] + 1:]

    def _per_layer(self, graph: fx.Graph) -> set[fx.Node]:
        """The nodes made from some layer's weights or state (the others every layer may share)."""
        found: set[fx.Node] = set()
        for node in graph.nodes:
            if self.layer_input(node) is not None or any(arg in found for arg in node.all_input_nodes):
                found.add(node)
        return found

    def _call_site_ops(self) -> dict:
        """Each layer's call-site op by ``(layer, module path in the layer)``, and back."""
        namespace = getattr(torch.ops, _compat.EXTERNALIZE_NAMESPACE)
        found: dict = {}
        for name, module in self.model.named_modules(remove_duplicate=False):
            op_name = _compat.externalized_op_name(module)
            if op_name is not None and name.startswith(self.prefix):
                index, _, rest = name[len(self.prefix):].partition(".")
                op = getattr(namespace, op_name).default
                found[(int(index), rest)], found[op] = op, (int(index), rest)
        return found

    def target_in(self, target: Any, layer: int) -> Any:
        """``target``, or, for a layer's call-site op, the same module's op in ``layer``."""
        found = self.ops.get(target)
        if not isinstance(found, tuple):
            return target
        if (layer, found[1]) not in self.ops:
            raise NotRepeatable(f"layer {layer}'s {found[1]} is no composite")
        return self.ops[(layer, found[1])]

    def _check(self) -> None:
        """The last traced layer's graph is the one before's, each over its own layer (module docstring)."""
        template, reference, before = self.regions[-1], self.regions[-2], self.regions[-3]
        if not len(template) == len(reference) == len(before):
            raise NotRepeatable(f"the last layers traced make {len(before)}, {len(reference)} and {len(template)} nodes")
        self.at = {node: i for i, node in enumerate(template)}
        self.previous_at = {node: i for i, node in enumerate(reference)}
        before_at = {node: i for i, node in enumerate(before)}
        last, earlier = TRACED - 1, TRACED - 2

        def alike(t: Any, r: Any) -> None:
            if isinstance(t, fx.Node):
                if not isinstance(r, fx.Node):
                    raise NotRepeatable(f"{t.name} and {r!r}")
                if t in self.at:
                    ok = self.previous_at.get(r) == self.at[t]
                elif t in self.previous_at:
                    ok = before_at.get(r) == self.previous_at[t]
                elif (own := self.layer_input(t)) is not None:
                    ok = own[0] == last and self.layer_input(r) == (earlier, own[1])
                else:
                    ok = t is r and t not in self.per_layer
                if not ok:
                    raise NotRepeatable(f"layer {last} reads {t.name} where layer {earlier} reads {r.name}")
            elif isinstance(t, (list, tuple)):
                if not isinstance(r, (list, tuple)) or len(t) != len(r):
                    raise NotRepeatable(f"{t!r} and {r!r}")
                for a, b in zip(t, r):
                    alike(a, b)
            elif isinstance(t, dict):
                if not isinstance(r, dict) or t.keys() != r.keys():
                    raise NotRepeatable(f"{t!r} and {r!r}")
                for name in t:
                    alike(t[name], r[name])
            elif isinstance(t, (torch.SymInt, torch.SymFloat, torch.SymBool)) or type(t) is not type(r) or t != r:
                raise NotRepeatable(f"layer {last} takes {t!r} where layer {earlier} takes {r!r}")

        self.name_step: dict[int, tuple[str, int, int]] = {}  # a node's name's base, number and step a layer
        steps: dict[str, set[int]] = {}
        for i, (t, r) in enumerate(zip(template, reference)):
            if t.op != r.op or self.target_in(t.target, earlier) != r.target:
                raise NotRepeatable(f"layer {last} calls {t.target} where layer {earlier} calls {r.target}")
            if t.target in self.ops:
                if t.target is r.target:
                    raise NotRepeatable(f"layers {earlier} and {last} call one module's op {t.target}")
            else:
                (base, number), (r_base, r_number) = _name_parts(t.name), _name_parts(r.name)
                if base != r_base:
                    raise NotRepeatable(f"layer {last}'s {t.name} is named otherwise than layer {earlier}'s {r.name}")
                self.name_step[i] = (base, number, number - r_number)
                steps.setdefault(base, set()).add(number - r_number)
            if t.meta.get("custom") != r.meta.get("custom"):
                raise NotRepeatable(f"layer {last}'s {t.name} is marked otherwise than layer {earlier}'s {r.name}")
            alike(t.args, r.args)
            alike(t.kwargs, r.kwargs)
        # What follows the layers is named as the whole trace names it: each name's number moved on by as many of
        # its kind as the repeated layers make (none where layers make a kind in steps of several sizes).
        self.base_step = {base: step.pop() for base, step in steps.items() if len(step) == 1}
        self.unsure = {base for base, step in steps.items() if len(step) > 1}

    # -- writing the repeated program

    def program(self) -> ExportedProgram:
        """The program of all ``count`` layers, node for node the one the whole trace makes, written in the whole
        trace's order: the placeholders (:meth:`_write_placeholders`), the traced layers and a copy of the last one
        per repeated layer (:meth:`_write_layers`), what follows the layers (:meth:`_write_tail`), the outputs
        (:meth:`_write_outputs`); then the weights and state the new inputs name (:meth:`_tensors`)."""
        source = self.source
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}  # each traced node's node in the new graph
        input_specs, inputs = self._write_placeholders(graph, env)
        copies = self._write_layers(graph, env, inputs)
        read_last = self._write_tail(graph, env, copies)
        output_specs = self._write_outputs(graph, env, copies, read_last)
        graph.lint()
        state_dict, constants = self._tensors(input_specs)
        return _compat.rebuilt(
            source,
            graph=graph,
            signature=ExportGraphSignature(input_specs=input_specs, output_specs=output_specs),
            state_dict=state_dict,
            range_constraints=copy.copy(source.range_constraints),
            module_call_graph=copy.deepcopy(source.module_call_graph),
            example_inputs=None,
            constants=constants,
            verifiers=[source.verifier],
        )

    def _write_placeholders(
        self, graph: fx.Graph, env: dict[fx.Node, fx.Node]
    ) -> tuple[list[InputSpec], dict[tuple[int, str], fx.Node]]:
        """The traced program's placeholders, each repeated layer's after the last traced layer's of the same kind
        (parameters, buffers), as the whole trace orders them; their input specs, and each layer's input by ``(layer,
        name in the layer)``."""
        signature = self.source.graph_signature
        inputs: dict[tuple[int, str], fx.Node] = {}
        input_specs: list[InputSpec] = []
        last = TRACED - 1
        last_of_kind = {
            kind: max(i for i, s in enumerate(signature.input_specs) if s.kind == kind and self._layer_spec(s) is not None)
            for kind in {s.kind for s in signature.input_specs if self._layer_spec(s) is not None}
        }
        for position, spec in enumerate(signature.input_specs):
            node = self.placeholders[spec.arg.name]
            env[node] = self._placeholder(graph, node, spec.arg.name, None)
            input_specs.append(InputSpec(spec.kind, TensorArgument(env[node].name), spec.target, spec.persistent))
            if self.layer_input(node) is not None:
                inputs[self.layer_input(node)] = env[node]
            if last_of_kind.get(spec.kind) == position:
                for layer in range(TRACED, self.count):
                    for template in signature.input_specs:
                        found = self._layer_spec(template)
                        if template.kind != spec.kind or found is None or found[0] != last:
                            continue
                        node = self.placeholders[template.arg.name]
                        created = self._placeholder(graph, node, _renamed(template.arg.name, self.path, last, layer), layer)
                        inputs[(layer, found[1])] = created
                        target = f"{self.prefix}{layer}.{found[1]}"
                        input_specs.append(InputSpec(template.kind, TensorArgument(created.name), target, template.persistent))
        return input_specs, inputs

    def _write_layers(
        self, graph: fx.Graph, env: dict[fx.Node, fx.Node], inputs: dict[tuple[int, str], fx.Node]
    ) -> dict[int, dict[int, fx.Node]]:
        """The traced layers as they are, then a copy of the last one per repeated layer, each over its own inputs
        and the layer before's output; each layer's nodes from the last traced one on, by position in its region."""
        last = TRACED - 1
        for region in self.regions:
            for node in region:
                env[node] = graph.node_copy(node, env.__getitem__)
        copies: dict[int, dict[int, fx.Node]] = {last: {i: env[node] for i, node in enumerate(self.regions[-1])}}
        for layer in range(TRACED, self.count):
            current: dict[int, fx.Node] = {}
            previous = copies[layer - 1]

            def read(node: fx.Node) -> fx.Node:
                """What layer ``layer``'s copy reads where the last traced layer reads ``node``."""
                if node in self.at:
                    return current[self.at[node]]
                if node in self.previous_at:
                    return previous[self.previous_at[node]]
                found = self.layer_input(node)
                return inputs[(layer, found[1])] if found is not None else env[node]

            for i, node in enumerate(self.regions[-1]):
                current[i] = self._copy(graph, node, read, layer)
            copies[layer] = current
        return copies

    def _write_tail(
        self, graph: fx.Graph, env: dict[fx.Node, fx.Node], copies: dict[int, dict[int, fx.Node]]
    ) -> Callable[[fx.Node], fx.Node]:
        """What follows the layers, over the last layer's values; what it reads (for the outputs too)."""
        earlier = {node for region in self.regions[:-1] for node in region}

        def read_last(node: fx.Node) -> fx.Node:
            """What the tail reads where the traced tail reads ``node``: the last layer's value, or a shared one."""
            if node in self.at:
                return copies[self.count - 1][self.at[node]]
            if node in earlier and node in self.per_layer:
                raise NotRepeatable(f"what follows the layers reads {node.name}, of a layer before the last")
            return env[node]

        for node in self.tail:
            env[node] = self._tail_copy(graph, node, read_last)
        return read_last

    def _write_outputs(
        self, graph: fx.Graph, env: dict[fx.Node, fx.Node], copies: dict[int, dict[int, fx.Node]],
        read_last: Callable[[fx.Node], fx.Node],
    ) -> list[OutputSpec]:
        """The output node: the traced outputs, each repeated layer's new state after the last traced layer's; their
        output specs."""
        signature = self.source.graph_signature
        last = TRACED - 1
        output = self.source.graph.output_node()
        values, descriptions = list(output.args[0]), output.meta.get("desc")
        new_values, new_descriptions, output_specs = [], [], []
        last_state = max(
            (i for i, s in enumerate(signature.output_specs) if s.kind == OutputKind.BUFFER_MUTATION and s.target.startswith(self.prefix)),
            default=None,
        )
        for position, (value, spec) in enumerate(zip(values, signature.output_specs)):
            mapped = env[value] if spec.kind == OutputKind.BUFFER_MUTATION else read_last(value)
            new_values.append(mapped)
            new_descriptions.append(descriptions[position] if descriptions else None)
            output_specs.append(OutputSpec(spec.kind, TensorArgument(mapped.name), spec.target))
            if position != last_state:
                continue
            for layer in range(TRACED, self.count):
                for i, template in enumerate(signature.output_specs):
                    if template.kind != OutputKind.BUFFER_MUTATION or not template.target.startswith(f"{self.prefix}{last}."):
                        continue
                    if values[i] not in self.at:
                        raise NotRepeatable(f"layer {last}'s state {template.target} is written outside the layer")
                    created = copies[layer][self.at[values[i]]]
                    new_values.append(created)
                    new_descriptions.append(_renamed_desc(descriptions[i], self.path, last, layer) if descriptions else None)
                    output_specs.append(
                        OutputSpec(template.kind, TensorArgument(created.name), f"{self.prefix}{layer}.{template.target[len(f'{self.prefix}{last}.'):]}")
                    )
        created = graph.output(tuple(new_values))
        created.meta = copy.copy(output.meta)
        if descriptions:
            created.meta["desc"] = new_descriptions
        return output_specs

    def _tensors(self, input_specs: list[InputSpec]) -> tuple[dict, dict]:
        """The state dict and constants of ``input_specs``, in their order as the whole trace keeps them: the traced
        program's tensors, each repeated layer's from the model."""
        source = self.source
        tensors = {**dict(self.model.named_parameters(remove_duplicate=False)), **dict(self.model.named_buffers(remove_duplicate=False))}
        state_dict, constants = {}, {}
        for spec in input_specs:
            if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
                state_dict[spec.target] = source.state_dict[spec.target] if spec.target in source.state_dict else tensors[spec.target]
            elif spec.kind == InputKind.BUFFER:
                constants[spec.target] = source.constants[spec.target] if spec.target in source.constants else tensors[spec.target]
        constants.update((name, value) for name, value in source.constants.items() if name not in constants)
        return state_dict, constants

    def _layer_spec(self, spec: InputSpec) -> tuple[int, str] | None:
        """``(layer, name in the layer)`` of an input spec of one layer's parameter or buffer."""
        return self.layer_input(self.placeholders[spec.arg.name])

    def _placeholder(self, graph: fx.Graph, node: fx.Node, name: str, layer: int | None) -> fx.Node:
        """A copy of placeholder ``node`` named ``name``; for a repeated ``layer``, its meta naming that layer and
        its value that layer's tensor's."""
        created = graph.placeholder(name)
        created.meta = copy.copy(node.meta)
        if layer is not None:
            created.meta.update(_layer_meta(node.meta, self.path, TRACED - 1, layer))
            found = self.layer_input(node)
            tensor = self.model.get_submodule(self.path)[layer].get_parameter(found[1]) if self.spec_of[node.name].kind == InputKind.PARAMETER \
                else self.model.get_submodule(self.path)[layer].get_buffer(found[1])
            created.meta["val"] = node.meta["val"].fake_mode.from_tensor(tensor, static_shapes=True)
        return created

    def _copy(self, graph: fx.Graph, node: fx.Node, read: Callable[[fx.Node], fx.Node], layer: int) -> fx.Node:
        """Layer ``layer``'s copy of the last traced layer's ``node``, named as the whole trace names it."""
        target = self.target_in(node.target, layer)
        if target is not node.target:  # a call site, named after its op: its module's path, then the export's suffix
            name = _compat.layer_call_site_name(node.name, self.path, TRACED - 1, layer)
            if name is None:
                raise NotRepeatable(f"call site {node.name} is not named after its module")
        else:
            base, number, step = self.name_step[self.at[node]]
            name = _compat.fx_name(base, number + (layer - TRACED + 1) * step)
        created = _node_copy(graph, node, read, name)
        created.target = target
        created.meta.update(_layer_meta(node.meta, self.path, TRACED - 1, layer))
        return created

    def _tail_copy(self, graph: fx.Graph, node: fx.Node, read: Callable[[fx.Node], fx.Node]) -> fx.Node:
        """The copy of a node after the layers, its name's number moved on by as many of its kind as the repeated
        layers make."""
        base, number = _name_parts(node.name)
        if base in self.unsure:
            raise NotRepeatable(f"cannot tell how the whole trace names {node.name}")
        return _node_copy(graph, node, read, _compat.fx_name(base, number + (self.count - TRACED) * self.base_step.get(base, 0)))


def _name_parts(name: str) -> tuple[str, int]:
    """A node name's base and number (:func:`~coreai_partitioner._compat.fx_name_parts`); refused if it has none."""
    parts = _compat.fx_name_parts(name)
    if parts is None:
        raise NotRepeatable(f"node name {name!r}")
    return parts


def _node_copy(graph: fx.Graph, node: fx.Node, read: Callable[[fx.Node], fx.Node], name: str) -> fx.Node:
    """``graph.node_copy`` under ``name`` (a name the graph holds already would be renamed)."""
    created = graph.create_node(node.op, node.target, fx.map_arg(node.args, read), fx.map_arg(node.kwargs, read), name, node.type)
    if created.name != name:
        raise NotRepeatable(f"the name {name} is taken")
    created.meta = copy.copy(node.meta)
    return created


def _layer_meta(meta: dict, path: str, old: int, new: int) -> dict:
    """The entries of a node's ``meta`` that name its layer, renamed to layer ``new``."""
    renamed: dict = {}
    stack = meta.get("nn_module_stack")
    if stack:
        renamed["nn_module_stack"] = {
            _renamed_path(key, path, old, new): (_renamed_path(value[0], path, old, new), value[1]) for key, value in stack.items()
        }
    if "desc" in meta:
        renamed["desc"] = _renamed_desc(meta["desc"], path, old, new)
    return renamed


def _renamed_desc(description: Any, path: str, old: int, new: int) -> Any:
    """An AOT input or output descriptor naming layer ``old``'s tensor, naming layer ``new``'s."""
    if not dataclasses.is_dataclass(description):
        return description
    changes = {}
    for field in dataclasses.fields(description):
        value = getattr(description, field.name)
        if isinstance(value, str):
            changes[field.name] = _renamed_path(value, path, old, new)
        elif dataclasses.is_dataclass(value):
            changes[field.name] = _renamed_desc(value, path, old, new)
    return dataclasses.replace(description, **changes)


def _renamed(name: str, path: str, old: int, new: int) -> str:
    """A placeholder's name (``p_layers_3_mlp_up_weight``) for layer ``new``
    (:func:`~coreai_partitioner._compat.layer_placeholder_name`)."""
    renamed = _compat.layer_placeholder_name(name, path, old, new)
    if renamed is None:
        raise NotRepeatable(f"placeholder {name} does not name layer {old}")
    return renamed


def _renamed_path(text: str, path: str, old: int, new: int) -> str:
    """``text`` with the module path ``<path>.<old>`` (as a whole path component) made ``<path>.<new>``."""
    return re.sub(rf"(?:^|(?<=[._])){re.escape(path)}\.{old}(?=$|\.)", f"{path}.{new}", text)
