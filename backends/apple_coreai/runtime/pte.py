"""Read what a ``.pte`` ships: methods, delegates and their Core AI assets."""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coreai_partitioner import _compat
from coreai_partitioner._compat import deserialize_pte_views

if TYPE_CHECKING:  # importing ExecuTorch's compiler imports torchao, which prints: a command imports it when it reads
    from executorch.exir.schema import DelegateCall

#: Backend ids whose payload is a Core AI asset manifest (ours and upstream's).
COREAI_BACKEND_IDS = ("CoreAICompositeBackend", "CoreAIBackend")

_NAMED_DATA_PREFIX = "coreai/"


@dataclass(frozen=True)
class Delegate:
    """One delegate call in one method of a ``.pte``."""

    method: str
    index: int
    backend_id: str
    payload: bytes
    #: The Core AI manifest (``packaging``, ``hash``, ``path``, ...), or None.
    manifest: dict[str, Any] | None = None
    #: Inline asset files by path relative to the asset's ``<hash>/`` directory.
    files: dict[str, bytes | memoryview] = field(default_factory=dict, repr=False)

    @property
    def is_coreai(self) -> bool:
        return self.manifest is not None

    @property
    def packaging(self) -> str | None:
        return None if self.manifest is None else self.manifest.get("packaging")

    @property
    def asset_bytes(self) -> int:
        """Bytes of the asset embedded in the ``.pte`` (0 for a sidecar)."""
        return sum(len(data) for data in self.files.values())

    def asset_path(self, directory: str | os.PathLike, *, sidecar_dir: str | os.PathLike | None = None) -> Path:
        """The portable ``.aimodel`` of this delegate on disk.

        Inline assets are written under ``directory``; sidecar assets are found
        under ``sidecar_dir`` (the build's ``COREAI_SIDECAR_DIR``, by default
        the ``.pte``'s own directory at runtime).
        """
        if self.manifest is None:
            raise ValueError(f"delegate {self.index} of '{self.method}' ({self.backend_id}) is not a Core AI delegate")
        where = f"delegate {self.index} of '{self.method}'"
        return materialize(self.manifest, self.files, directory, sidecar_dir=sidecar_dir, where=where)


def materialize(
    manifest: dict[str, Any],
    files: dict[str, bytes],
    directory: str | os.PathLike,
    *,
    sidecar_dir: str | os.PathLike | None = None,
    where: str = "this delegate",
) -> Path:
    """The ``.aimodel`` a manifest names: ``files`` written under ``directory``, or the sidecar's."""
    if "path" not in manifest:
        raise ValueError(
            f"{where} ships AOT-compiled .aimodelc bundles ({manifest.get('packaging')}), which "
            "run only on Apple devices; lower without aot_compile_config to get a portable .aimodel"
        )
    if files:
        root = Path(directory) / manifest["hash"]
        for relative, data in files.items():
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return Path(directory) / manifest["path"]
    if sidecar_dir is None:
        raise ValueError(
            f"{where} ships its asset as a sidecar; pass sidecar_dir= (the directory "
            "COREAI_SIDECAR_DIR named at build time)"
        )
    path = Path(sidecar_dir) / manifest["path"]
    if not path.is_dir():
        raise FileNotFoundError(f"sidecar asset of {where} not found: {path}")
    return path


def asset_files(named_data: Any, model_hash: str) -> dict[str, bytes]:
    """The files of the asset ``model_hash`` in a NamedDataStoreOutput, by path under ``<hash>/``: its ``.pte``
    entries and those bound for a data file (``external_data``) alike."""
    if named_data is None:
        return {}
    prefix = f"{_NAMED_DATA_PREFIX}{model_hash}/"
    entries = dict(named_data.pte_data)
    for external in named_data.external_data.values():
        entries.update(external)
    return {
        key[len(prefix) :]: _as_bytes(named_data.buffers[entry.buffer_index])
        for key, entry in entries.items()
        if key.startswith(prefix)
    }


def _as_bytes(data: Any) -> bytes:
    """A named-data buffer as bytes: in memory, or a file ExecuTorch keeps on disk until written."""
    return data.to_bytes() if hasattr(data, "to_bytes") else bytes(data)


@dataclass(frozen=True)
class Argument:
    """One argument of a delegate call, as the ``.pte``'s execution plan declares it."""

    kind: str  # the EValue's type: "Tensor", "Int", ...
    dtype: str | None = None  # a tensor's ScalarType name: "HALF", "FLOAT", "INT", ...
    sizes: tuple[int, ...] = ()
    dynamism: str | None = None  # a tensor's TensorShapeDynamism: "STATIC", "DYNAMIC_BOUND", ...
    dim_order: tuple[int, ...] = ()


@dataclass(frozen=True)
class MethodPlan:
    """A method's inputs and outputs (value indices), its instructions' arguments and its values."""

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    instructions: tuple[Any, ...]
    values: tuple[Any, ...] = ()

    @property
    def delegate_calls(self) -> list[DelegateCall]:
        from executorch.exir.schema import DelegateCall

        return [args for args in self.instructions if isinstance(args, DelegateCall)]

    def arguments(self, call: DelegateCall) -> list[Argument]:
        """What ``call`` passes its delegate (inputs, then outputs), read off the plan's values."""
        found = []
        for index in call.args:
            value = self.values[index].val
            if type(value).__name__ != "Tensor":
                found.append(Argument(type(value).__name__))
                continue
            found.append(
                Argument(
                    "Tensor",
                    value.scalar_type.name,
                    tuple(value.sizes),
                    value.shape_dynamism.name,
                    tuple(value.dim_order),
                )
            )
        return found


@dataclass(frozen=True)
class PteContents:
    """What :func:`read_pte` found."""

    methods: tuple[str, ...]
    delegates: tuple[Delegate, ...]
    size: int
    plans: dict[str, MethodPlan] = field(default_factory=dict)

    def coreai_delegates(self, method: str | None = None) -> list[Delegate]:
        return [d for d in self.delegates if d.is_coreai and method in (None, d.method)]


def data_file_of(pte: Any) -> Path | None:
    """The data file (``.ptd``) a ``.pte`` path runs with: the one a ``PteWithData`` carries, else the ``.ptd`` of
    the same name beside it, if there is one (what ``save_pte`` writes for ``external_data``)."""
    if isinstance(pte, (bytes, bytearray, memoryview)):
        return None
    carried = getattr(pte, "data", None)
    if carried is not None:
        return Path(carried)
    beside = Path(pte).with_suffix(".ptd")
    return beside if beside.is_file() else None


def read_pte(pte: bytes | bytearray | str | os.PathLike, data_path: str | os.PathLike | None = None) -> PteContents:
    """Parse a serialized ``.pte`` (bytes or a path), with its data file (``.ptd``) if it has one.

    A path is mapped, not read, and asset files are views of the data: reading
    a .pte costs its flatbuffer, not its weights.  ``data_path`` defaults to
    the ``.ptd`` of the ``.pte``'s name beside it, if there is one (or the
    data file a ``PteWithData`` carries); its named data is the runtime's too.
    """
    if isinstance(pte, (bytes, bytearray, memoryview)):
        data = memoryview(pte)
    else:
        data = _mapped(pte)
        data_path = data_path if data_path is not None else data_file_of(pte)
    program, named_data = deserialize_pte_views(data)
    if data_path is not None:
        named_data = {**_compat.deserialize_ptd_views(_mapped(data_path)), **named_data}

    delegates = []
    plans = {}
    for plan in program.execution_plan:
        plans[plan.name] = MethodPlan(
            tuple(plan.inputs),
            tuple(plan.outputs),
            tuple(i.instr_args for chain in plan.chains for i in chain.instructions),
            tuple(plan.values),
        )
        for index, delegate in enumerate(plan.delegates):
            payload = bytes(program.backend_delegate_data[delegate.processed.index].data)
            manifest = coreai_manifest(delegate.id, payload)
            files = {} if manifest is None else _files_under(named_data, manifest["hash"])
            delegates.append(Delegate(plan.name, index, delegate.id, payload, manifest, files))
    return PteContents(
        tuple(plan.name for plan in program.execution_plan), tuple(delegates), len(data), plans
    )


def _mapped(path: str | os.PathLike) -> memoryview:
    with open(path, "rb") as file:
        return memoryview(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ))


def _files_under(named_data: dict[str, memoryview], model_hash: str) -> dict[str, memoryview]:
    prefix = f"{_NAMED_DATA_PREFIX}{model_hash}/"
    return {key[len(prefix) :]: data for key, data in named_data.items() if key.startswith(prefix)}


def coreai_manifest(backend_id: str, payload: bytes) -> dict[str, Any] | None:
    """A Core AI delegate's manifest, or None for another backend's delegate."""
    if backend_id not in COREAI_BACKEND_IDS:
        return None
    return json.loads(payload.decode("utf-8"))
