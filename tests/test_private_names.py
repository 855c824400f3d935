"""Other packages' private names are reached only through ``coreai_partitioner/_compat/``.

A private name of torch, ExecuTorch, coreai-torch, coreai-core or
transformers is one that starts with ``_`` (``__dunder__`` names aside): a
module path component (``torch._ops``), an imported name
(``_ExternalizedExportedProgram``), a keyword argument
(``_externalized_exported_programs=``), an attribute read or written
(``lowered._backend_id``, ``getattr(op, "_schema")``; a private attribute written on anything but ``self`` or
``cls`` is another package's, whatever names of ours), a logger or module
named by a string (``"torch.utils._pytree"``), or a method a class of ours
overrides.  Every ``.py`` under ``coreai_partitioner/`` and ``backends/``
but those of ``_compat/`` is read as source; an attribute is private to another
package when no module of ours defines the name.  ATen and edge operator
names (``torch.ops.aten._to_copy``) are operator schemas' names, not Python
ones, and are allowed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPAT = ROOT / "coreai_partitioner" / "_compat"
FOREIGN = ("torch", "executorch", "coreai_torch", "coreai", "transformers")
FILES = sorted(p for folder in ("coreai_partitioner", "backends") for p in (ROOT / folder).rglob("*.py") if COMPAT not in p.parents)
DOTTED_FOREIGN = re.compile(rf"({'|'.join(FOREIGN)})(\.\w+)+")
IDENTIFIER = re.compile(r"_[A-Za-z]\w*")
#: Dependencies a module of ours may need that the test environment need not have.
OPTIONAL = ("optimum",)


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = ("coreai_partitioner", *parts) if parts[0] == "backends" else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parsed() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in FILES}


def our_names(trees: dict[Path, ast.Module]) -> set[str]:
    """Every name a module of ours defines: functions, classes, variables, parameters, ``self`` attributes, modules."""
    names = {path.stem for path in FILES}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
    return names


def operator_name(node: ast.Attribute) -> bool:
    """``torch.ops.aten._to_copy``, ``edge_ops.edge.aten._to_copy``: an op in an op namespace."""
    chain = ast.unparse(node.value).split(".")
    return any(part == "ops" or part.endswith("_ops") for part in chain[:-1])


def foreign_roots(tree: ast.Module) -> set[str]:
    """The names a module binds to another package's modules or objects by importing them."""
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {(alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name.split(".")[0] in FOREIGN}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in FOREIGN:
            roots |= {alias.asname or alias.name for alias in node.names}
    return roots


def reaches(path: Path, tree: ast.Module, ours: set[str]) -> list[str]:
    """Every place ``tree`` reaches another package's private name, as ``path:line: what``."""
    found: list[str] = []
    roots = foreign_roots(tree)
    suffixes = {
        id(arg) for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "endswith"
        for arg in ast.walk(node)
    }
    formatted = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in ast.walk(node)}
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}

    def say(node: ast.AST, what: str) -> None:
        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in FOREIGN and any(map(private, parts)):
                    say(node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            parts = (node.module or "").split(".")
            if parts[0] in FOREIGN:
                names = [alias.name for alias in node.names]
                if any(map(private, parts)) or any(map(private, names)):
                    say(node, f"from {node.module} import {', '.join(names)}")
        elif isinstance(node, ast.Attribute) and private(node.attr) and not operator_name(node):
            chain_root = node.value
            while isinstance(chain_root, ast.Attribute):
                chain_root = chain_root.value
            base = node.value
            is_super = isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"
            if isinstance(chain_root, ast.Name) and chain_root.id in roots:
                say(node, f"{ast.unparse(node)} (a private name of {chain_root.id})")
            elif node.attr not in ours or (is_super and not any(node.attr in method_names(c) for c in classes.values())):
                say(node, f"{ast.unparse(node)} (no module of ours defines {node.attr})")
            elif isinstance(node.ctx, ast.Store) and not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                # our code writes a private attribute on itself only: on any other object it is that object's
                # package's, even where a class of ours has an attribute of the same name
                say(node, f"{ast.unparse(node)} written (a private attribute of an object not ours)")
        elif isinstance(node, ast.keyword) and node.arg is not None and private(node.arg) and node.arg not in ours:
            say(node.value, f"keyword {node.arg}=")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in formatted:
            text = node.value
            if DOTTED_FOREIGN.fullmatch(text) and any(map(private, text.split("."))):
                say(node, f"{text!r} (a private module path)")
            elif IDENTIFIER.fullmatch(text) and text not in ours and id(node) not in suffixes:
                say(node, f"{text!r} (no module of ours defines {text})")
    return found


def method_names(node: ast.ClassDef) -> set[str]:
    return {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_no_module_outside_compat_reaches_a_private_name_of_another_package():
    trees = parsed()
    ours = our_names(trees)
    found = [line for path, tree in trees.items() for line in reaches(path, tree, ours)]
    assert found == [], "reach these through coreai_partitioner/_compat/:\n" + "\n".join(found)


def test_the_scan_finds_each_kind_of_private_reach_and_allows_operator_names():
    source = textwrap.dedent(
        """
        import torch
        from torch._ops import OpOverload
        import executorch.exir._serialize
        from coreai_torch import _patch_model_for_externalization
        converter.add_exported_program(program, _externalized_exported_programs=records)
        lowered._backend_id = "x"
        torch._guards.detect_fake_mode
        getattr(op, "_schema", None)
        logging.getLogger("torch.utils._pytree")
        super()._constant_from_tensor(tensor)
        torch.ops.aten._to_copy.default
        leaf.endswith("_cache")
        f"{name}_scale"
        """
    )
    found = reaches(ROOT / "coreai_partitioner" / "probe.py", ast.parse(source), set())
    assert sorted(line.split(": ", 1)[1] for line in found) == sorted([
        "from torch._ops import OpOverload",
        "import executorch.exir._serialize",
        "from coreai_torch import _patch_model_for_externalization",
        "keyword _externalized_exported_programs=",
        "lowered._backend_id (no module of ours defines _backend_id)",
        "torch._guards (a private name of torch)",
        "'_schema' (no module of ours defines _schema)",
        "'torch.utils._pytree' (a private module path)",
        "super()._constant_from_tensor (no module of ours defines _constant_from_tensor)",
    ])


def test_a_private_attribute_written_on_another_object_is_found_even_where_a_class_of_ours_has_that_name():
    """``partition/partitioner.py`` wrote torch's ``ExportedProgram._constants`` (now ``_compat.program_with_constants``);
    the scan missed it because two classes of ours have a ``_constants`` of their own.  A write on ``self`` stays
    allowed."""
    source = textwrap.dedent(
        """
        own = copy.copy(program)
        own._constants = dict(program.constants)
        self._constants = {}
        value = other._constants
        """
    )
    found = reaches(ROOT / "coreai_partitioner" / "probe.py", ast.parse(source), {"_constants"})
    assert [line.split(": ", 1)[1] for line in found] == [
        "own._constants written (a private attribute of an object not ours)"
    ]


def classes_with_private_methods(trees: dict[Path, ast.Module]) -> list[tuple[str, str, set[str]]]:
    """``(module, class, private method names)`` for every class of ours that defines a private method."""
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and (names := {n for n in method_names(node) if private(n)}):
                found.append((module_name(path), node.name, names))
    return found


def test_no_class_outside_compat_overrides_a_private_method_of_another_package():
    overridden = []
    for module, name, methods in classes_with_private_methods(parsed()):
        try:
            owner = importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name in OPTIONAL:
                continue
            raise
        cls = getattr(owner, name, None)
        if not inspect.isclass(cls):
            continue  # a class defined inside a function
        for base in cls.__mro__[1:]:
            if base.__module__.split(".")[0] in FOREIGN:
                overridden += [f"{module}.{name}.{m} overrides {base.__module__}.{base.__name__}.{m}"
                               for m in sorted(methods) if m in vars(base)]
    assert overridden == [], "\n".join(overridden)
