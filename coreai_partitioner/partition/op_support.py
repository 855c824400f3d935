"""Which nodes a Core AI delegate takes: upstream's rules, plus externalized call sites.

Upstream's ``_OperatorsSupportedForCoreAIBackend`` decides for ordinary ops;
an externalized call site is taken when the partitioner paired it with a
record and the delegate can carry its operands.  Where this differs from
upstream, the reason is in the method that differs.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch

from coreai_partitioner import _compat
from coreai_partitioner.partition import claims
from coreai_partitioner.backends.apple_coreai.passes import is_unpack_int4
from coreai_partitioner.records.call_sites import externalized_op_name

logger = logging.getLogger("coreai_partitioner.partition.partitioner")


class OperatorSupport(_compat.UpstreamOperatorSupport):
    """Upstream's op support, plus the externalized call sites that have a record.

    Rejected call sites are kept with the reason, for the error that follows.
    """

    def __init__(self, claimable: set[str], unpaired: dict[str, str], constants: frozenset[str] = frozenset()) -> None:
        """``claimable``: call sites paired with a record; ``unpaired``: why others are not; ``constants``: the
        placeholders whose data the delegate takes over (parameters, buffers no method writes, lifted constants)."""
        super().__init__(log=logger.isEnabledFor(logging.INFO))
        self._claimable = claimable
        self._unpaired = unpaired
        self._constants = constants
        self.rejected: dict[str, str] = {}
        #: op -> every reason :mod:`.claims` gave for keeping a node of it outside
        self.refused: dict[str, list[str]] = {}

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        if node.op == "call_function" and externalized_op_name(node.target) is not None:
            reason = self._rejection(node)
            if reason is not None:
                self.rejected[node.name] = reason
            return reason is None
        if is_unpack_int4(node):
            # a packed int4 weight's integers: the backend folds the op into the weight (passes.packed_int4_constants)
            return _placeholder_name(node.args[0]) in self._constants and not node.meta.get(_compat.DO_NOT_DELEGATE_TAG)
        reason = claims.refusal(node)  # every rule, whatever path below would take the node
        if reason is not None:
            self._refuse(node, reason)
            return False
        if node.op != "call_function":
            return super().is_node_supported(submodules, node)
        tagged = bool(node.meta.get(_compat.DO_NOT_DELEGATE_TAG, False))
        if _in_narrowed_index(node):
            # topk's int64 indices, narrowed to int32 right away: coreai-torch converts topk with si32
            # indices, so no int64 value exists in the delegate or crosses its boundary (MoE routers).
            return not tagged
        if _is_int32_cast(node) and _placeholder_name(node.args[0]) in self._constants:
            # a 64-bit constant narrowed by get_default_passes(): the delegate takes the constant's data and the cast
            # (coreai-torch narrows 64-bit constants itself), so nothing is left outside for it
            return not tagged
        if _is_pool_with_unread_indices(node):
            # max_pool2d_with_indices returns int64 indices beside its values; the converter returns zeros for them,
            # and a delegate cannot carry int64: claimed when only the values are read (claims/pooling.py checks it).
            return not tagged
        if is_symbolic_scalar(node.meta.get("val")) and not self._readers_inside(submodules, node):
            return False  # a delegate cannot return it: the scalar stays with its readers, outside
        if _has_symbolic_scalar(node):
            return self._supports_symbolic(node)
        functional = _compat.functional_copy_op(node.target)
        if functional is not None and not _compat.is_coreai_supported_target(node.target):
            # an ATen *_copy view op (a program partitioned on ATen IR): judged as the functional op the backend
            # converts it as (backends/apple_coreai/asset.py), as upstream judges an edge one
            original, node.target = node.target, functional
            try:
                return super().is_node_supported(submodules, node)
            finally:
                node.target = original
        return super().is_node_supported(submodules, node)

    def _refuse(self, node: torch.fx.Node, reason: str) -> None:
        reasons = self.refused.setdefault(str(_compat.aten_op(node.target)), [])
        if reason not in reasons:
            reasons.append(reason)
        self.log_once(f"Node {node.name} stays outside the delegate: {reason}")

    def _rejection(self, node: torch.fx.Node) -> str | None:
        if node.name in self._unpaired:
            return (
                self._unpaired[node.name] + "; re-run externalize_modules on the "
                "transformed model (see the UserWarning above)"
            )
        if node.name not in self._claimable:
            return (
                "it has no record: pass the records externalize_modules returned for "
                "this program as CoreAIPartitioner(externalized_modules=records)"
            )
        if node.meta.get(_compat.DO_NOT_DELEGATE_TAG, False):
            return (
                "it is marked do_not_delegate, and nothing outside a Core AI delegate can run "
                "a composite op; remove the mark, or leave its class out of the specs to keep "
                "it as ordinary operators"
            )
        for val in _compat.node_tensor_vals(node):
            if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return "it takes a symbolic scalar, which a Core AI delegate cannot take"
            if isinstance(val, torch.Tensor) and val.dtype in (torch.int64, torch.float64):
                return (
                    f"it takes or returns a {val.dtype} tensor, which a Core AI delegate "
                    "cannot carry; cast it to 32 bits before the call inside the model "
                    "(get_default_passes() narrows only 64-bit graph inputs)"
                )
        return None

    def _readers_inside(self, submodules: Any, node: torch.fx.Node) -> bool:
        """Whether every reader of ``node`` (a symbolic scalar) is one a delegate takes."""
        return all(user.op == "call_function" and self.is_node_supported(submodules, user) for user in node.users)

    def _supports_symbolic(self, node: torch.fx.Node) -> bool:
        """An op with a symbolic scalar operand (a view or expand over an LLM's token count ``T``, ``sym_size``).

        Upstream rejects every node with a SymInt operand, so a program exported
        with a dynamic dim splits into many delegates and its state leaves them.
        coreai-torch converts such ops with symbolic shapes; a SymInt never
        crosses the delegate boundary as long as the ``sym_size`` producing it is
        inside too, which this also accepts.
        """
        if node.meta.get(_compat.DO_NOT_DELEGATE_TAG, False) or not _compat.is_coreai_supported_target(node.target):
            return False
        if any(_from_scalar_input(arg) for arg in node.all_input_nodes):
            return False  # a symbolic scalar the program takes as an input cannot be a Core AI input
        return not any(
            isinstance(val, torch.Tensor) and val.dtype in (torch.int64, torch.float64)
            for val in _compat.node_tensor_vals(node)
        )


def is_symbolic_scalar(value: Any) -> bool:
    """``value`` (a node's ``meta["val"]``) is a symbolic int, float or bool."""
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _from_scalar_input(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a symbolic scalar computed from a scalar the program takes as an input."""
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        if current in seen or not is_symbolic_scalar(current.meta.get("val")):
            continue
        seen.add(current)
        if current.op == "placeholder":
            return True
        pending.extend(current.all_input_nodes)
    return False


def _has_symbolic_scalar(node: torch.fx.Node) -> bool:
    return any(is_symbolic_scalar(val) for val in _compat.node_tensor_vals(node))


def _is_int32_cast(node: torch.fx.Node) -> bool:
    return (
        node.op == "call_function"
        and _compat.aten_op(node.target) is torch.ops.aten._to_copy.default
        and node.kwargs.get("dtype") == torch.int32
        and set(node.kwargs) <= {"dtype"}
    )


def _narrowed_indices(getitem: torch.fx.Node) -> bool:
    """``getitem`` takes topk's indices, and every user casts them to int32."""
    source = getitem.args[0] if getitem.target is operator.getitem and getitem.args else None
    return (
        isinstance(source, torch.fx.Node)
        and source.op == "call_function"
        and _compat.aten_op(source.target) is torch.ops.aten.topk.default
        and getitem.args[1] == 1
        and bool(getitem.users)
        and all(_is_int32_cast(user) for user in getitem.users)
    )


def _in_narrowed_index(node: torch.fx.Node) -> bool:
    """``node`` is a topk whose indices are only ever narrowed to int32, that narrowing's getitem, or its cast."""
    target = _compat.aten_op(node.target)
    if target is torch.ops.aten.topk.default:
        indices = [user for user in node.users if user.target is operator.getitem and user.args[1] == 1]
        return all(_narrowed_indices(user) for user in indices)
    if node.target is operator.getitem:
        return _narrowed_indices(node)
    if _is_int32_cast(node):
        source = node.args[0]
        return isinstance(source, torch.fx.Node) and _narrowed_indices(source)
    return False


def _placeholder_name(node: Any) -> str | None:
    return node.name if isinstance(node, torch.fx.Node) and node.op == "placeholder" else None


def _is_pool_with_unread_indices(node: torch.fx.Node) -> bool:
    if _compat.aten_op(node.target) is not torch.ops.aten.max_pool2d_with_indices.default:
        return False
    source = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    return (
        isinstance(source, torch.Tensor)
        and source.dtype in (torch.float16, torch.float32)
        and not any(user.args[1] == 1 and user.users for user in node.users if user.target is operator.getitem)
    )


