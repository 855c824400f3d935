"""An exported program's weights: which ops outside the composites read each, and swapping them for compressed ones.

Pure functions over ``ExportedProgram``\\ s.  :func:`outside_composites`
finds the floating weights (rank 2 and up) some op outside a composite call
site reads, with those ops; a weight read only by composites is their
operand and stays as it is.  :func:`replace_weights` returns a program whose
graph reads each named weight through its compressed buffers and the op that
expands them (:class:`~.weight_forms.Compressed`), the float parameter gone
from the state dict.  Either works on ``torch.export``'s program, decomposed
or not, and leaves it as it was.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument

from coreai_partitioner import _compat
from coreai_partitioner.records.call_sites import externalized_op_name
from coreai_partitioner.records.programs import graph_module_copy
from coreai_partitioner.quantize.weight_forms import Compressed

__all__ = ["Weight", "is_kept", "outside_composites", "parameter_users", "replace_weights"]


@dataclass(frozen=True)
class Weight:
    """A weight ops outside the composites read: parameter ``name`` (``aliases``: the other names of the same
    tensor, a tied lm_head's), ``layer`` (the module holding it), those ``ops`` (under every name), its ``shape``."""

    name: str
    layer: str
    ops: tuple[str, ...]
    shape: tuple[int, ...]
    aliases: tuple[str, ...] = ()

    @property
    def is_embedding(self) -> bool:
        """Read by an embedding lookup (a tied lm_head reads the same tensor)."""
        return "embedding.default" in self.ops

    @property
    def inputs(self) -> int | None:
        """The axis of its input channels when not the one after its output channels: 0 for a transposed
        convolution's ``[in, out / groups, *kernel]``."""
        return 0 if any(op.startswith("conv_transpose") for op in self.ops) else None

    def is_kept(self, keep_float: Sequence[str]) -> bool:
        """Whether ``keep_float`` names this weight under any of its names (one tensor stays float or not)."""
        return any(is_kept(name, name.rpartition(".")[0], keep_float) for name in (self.name, *self.aliases))


def op_label(node: torch.fx.Node) -> str:
    return getattr(node.target, "__name__", str(node.target))


def is_composite(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and externalized_op_name(node.target) is not None


def is_kept(name: str, layer: str, keep_float: Sequence[str]) -> bool:
    """Whether ``keep_float`` (module paths or parameter names) names this weight, its layer or a parent of it."""
    return any(k in (name, layer) or layer.startswith(k + ".") for k in keep_float)


def parameter_users(program: ExportedProgram, min_dim: int = 2) -> dict[str, list[torch.fx.Node]]:
    """``{parameter FQN: the nodes reading it}`` for every floating parameter of ``min_dim``+ dims."""
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    users = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind != InputKind.PARAMETER:
            continue
        value = program.state_dict.get(spec.target)
        if value is None or not value.is_floating_point() or value.dim() < min_dim or value.numel() == 0:
            continue
        users[spec.target] = list(placeholders[spec.arg.name].users)
    return users


def outside_composites(program: ExportedProgram) -> dict[str, Weight]:
    """Floating weights some op outside a composite reads, one per tensor (its first name): what quantization is for."""
    names: dict[int, list[str]] = {}
    for name in parameter_users(program):
        names.setdefault(id(program.state_dict[name]), []).append(name)
    users = parameter_users(program)
    weights = {}
    for group in names.values():
        outside = tuple(sorted({op_label(n) for name in group for n in users[name] if not is_composite(n)}))
        if outside:
            first = group[0]
            shape = tuple(program.state_dict[first].shape)
            weights[first] = Weight(first, first.rpartition(".")[0], outside, shape, tuple(group[1:]))
    return weights


def replace_weights(program: ExportedProgram, compressed: Mapping[str, Compressed]) -> ExportedProgram:
    """``program`` reading each parameter named in ``compressed`` through its buffers and expanding op.

    The buffers become persistent buffers ``<parameter>_<buffer>`` (placeholders
    ``b_<parameter>_<buffer>``: coreai-torch finds a look-up table's indices and
    table by those names); the expanding op is placed after the placeholders,
    once per tensor: every other name of the same tensor (a tied lm_head's)
    reads it too.  Those parameters leave the program.  The graph is copied,
    never the weights.
    """
    graph_module = graph_module_copy(program)  # a plain deepcopy renames a user input "input"
    graph = graph_module.graph
    placeholders = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    fake = _compat.detect_fake_mode([node.meta.get("val") for node in placeholders.values()])
    first_op = next(node for node in graph.nodes if node.op != "placeholder")
    state_dict = dict(program.state_dict)

    def call(op: Any, args: tuple[Any, ...]) -> torch.fx.Node:  # an expanding op, as a node before the program's ops
        with graph.inserting_before(first_op):
            made = graph.call_function(op, args)
        with fake:
            made.meta["val"] = op(*[a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args])
        return made

    owner = {id(state_dict[name]): name for name in compressed}  # tensor -> the name it is compressed under
    expanded: dict[str, torch.fx.Node] = {}
    specs, aliases = [], []
    for spec in program.graph_signature.input_specs:
        name = owner.get(id(state_dict.get(spec.target))) if spec.kind == InputKind.PARAMETER else None
        if name is None:
            specs.append(spec)
            continue
        node = placeholders[spec.arg.name]
        if spec.target != name:
            aliases.append((node, name))
            continue
        operands = {}
        for (buffer, tensor), placeholder_name in zip(compressed[name].buffers.items(), _placeholder_names(name, compressed[name])):
            with graph.inserting_before(node):
                operand = graph.placeholder(placeholder_name)
            # FX snake-cases a name it makes (T5's "SelfAttention" becomes "self_attention") but keeps the target:
            # as torch.export's placeholders, the target is the name, which coreai-torch looks the buffer up by
            operand.target = operand.name
            operand.meta["val"] = fake.from_tensor(tensor, static_shapes=True)
            specs.append(InputSpec(InputKind.BUFFER, TensorArgument(operand.name), f"{name}_{buffer}", persistent=True))
            operands[buffer] = operand
        expanded[name] = compressed[name].build(call, operands)
        aliases.append((node, name))
    for node, name in aliases:
        node.replace_all_uses_with(expanded[name])
        graph.erase_node(node)
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.PARAMETER and id(state_dict.get(spec.target)) in owner:
            del state_dict[spec.target]
    for name, parts in compressed.items():
        state_dict.update({f"{name}_{buffer}": tensor for buffer, tensor in parts.buffers.items()})
    graph.lint()
    graph_module.recompile()
    return _compat.rebuilt(
        program, root=graph_module, graph=graph,
        signature=ExportGraphSignature(specs, program.graph_signature.output_specs), state_dict=state_dict,
    )


def _placeholder_names(parameter: str, compressed: Compressed) -> list[str]:
    """``b_<parameter>_<buffer>``; plain numbered names when the parameter's own name holds another buffer's name."""
    stem = parameter.replace(".", "_")
    buffers = list(compressed.buffers)
    if any(other in stem for other in buffers):
        stem = "weight_" + hashlib.sha1(parameter.encode()).hexdigest()[:8]
    return [f"b_{stem}_{buffer}" for buffer in buffers]
