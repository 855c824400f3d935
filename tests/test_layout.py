"""The tree shows the architecture: a stage is a folder, each imports only the stages before it, docs/architecture.md
draws it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "coreai_partitioner"

#: The stages in the order a record and a model go through them; a module imports only its own stage and the
#: ones before it.  The package's root modules (the seam to other packages, the console) come first.
STAGES = (
    "root", "records", "backends", "partition", "checkpoints", "quantize", "adapters", "lowering", "verify", "seq2seq", "blocks", "text_decoder",
    "text_generation", "image_text_to_text", "audio_text_to_text", "speech_recognition", "text_to_speech", "text_to_image", "text2text",
    "text_encoder", "image_classification", "recipes", "cli",
)

#: A task's own room: what only it exports.  What two tasks share lives in a stage before them (``blocks/``,
#: ``text_decoder/``, ``lowering/``), never in one task's room.
TASK_ROOMS = (
    "text_generation", "image_text_to_text", "audio_text_to_text", "speech_recognition", "text_to_speech", "text_to_image", "text2text",
    "text_encoder", "image_classification",
)


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (``backends/`` installs as ``coreai_partitioner.backends``)."""
    found = {}
    for base, prefix in ((PACKAGE, "coreai_partitioner"), (ROOT / "backends", "coreai_partitioner.backends")):
        for path in base.rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((prefix, *parts))] = path
    return found


def stage_of(module: str) -> str:
    parts = module.split(".")
    if parts[1:2] == ["__main__"]:  # python -m coreai_partitioner: the command line
        return "cli"
    if len(parts) < 2 or parts[1] not in STAGES:
        return "root"
    return parts[1]


def imported(module: str, path: Path) -> set[str]:
    """The package's modules ``module`` imports (a public name of the package's root counts as its module)."""
    from coreai_partitioner import _PUBLIC  # name -> ".records.externalize", ...

    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                if base == "coreai_partitioner" and alias.name in _PUBLIC:
                    names.add("coreai_partitioner" + _PUBLIC[alias.name])
                else:
                    names.add(f"{base}.{alias.name}")
                names.add(base)
    return {name for name in names if name.startswith("coreai_partitioner.")}


def test_every_module_of_the_package_belongs_to_a_stage_folder_or_is_one_of_the_roots_few():
    roots = {m for m in modules() if stage_of(m) == "root"} - {"coreai_partitioner"}
    seam = {m for m in roots if m.startswith("coreai_partitioner._compat")}  # the seam to other packages, one folder
    assert roots - seam == {"coreai_partitioner.console"}
    assert seam == {f"coreai_partitioner._compat{part}" for part in ("", ".coreai_internals", ".executorch_internals", ".torch_internals")}


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_imports_only_itself_and_the_stages_before_it(stage):
    allowed = set(STAGES[: STAGES.index(stage) + 1])
    later = []
    for module, path in sorted(modules().items()):
        if stage_of(module) != stage or module == "coreai_partitioner":
            continue
        for name in sorted(imported(module, path)):
            if stage_of(name) not in allowed:
                later.append(f"{module} imports {name} ({stage_of(name)}, a later stage)")
    assert not later, "\n".join(later)


@pytest.mark.parametrize("room", TASK_ROOMS)
def test_a_tasks_room_imports_no_other_tasks_room(room):
    others = set(TASK_ROOMS) - {room}
    found = [
        f"{module} imports {name}"
        for module, path in sorted(modules().items())
        if stage_of(module) == room
        for name in sorted(imported(module, path))
        if stage_of(name) in others
    ]
    assert not found, "\n".join(found)


def test_no_modules_import_each_other_even_through_others():
    """The package's import graph between its modules (a package's ``__init__`` left out) has no circle."""
    found = modules()
    leaves = {name for name, path in found.items() if path.name != "__init__.py"}
    graph = {}
    for module in leaves:
        names = imported(module, found[module])  # "a.b.name" counts as module a.b
        graph[module] = {n if n in leaves else n.rpartition(".")[0] for n in names} & leaves - {module}
    circles, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            circles.append(" -> ".join(path[path.index(module) :] + [module]))
            return
        if module in done:
            return
        for name in sorted(graph[module]):
            visit(name, path + [module])
        done.add(module)

    for module in sorted(leaves):
        visit(module, [])
    assert not circles, "\n".join(circles)


def drawn_tree() -> list[str]:
    """The Layout drawing of docs/architecture.md, a line per folder or file."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("## Layout", 1)[1]
    return section.split("```", 2)[1].splitlines()[1:]


def test_the_architecture_page_draws_every_stage_folder_and_names_only_paths_that_exist():
    tree = drawn_tree()
    drawn = [re.match(r"[\s│├└─]*(\S+)", line).group(1) for line in tree if line.strip()]
    folders = {f"{p.relative_to(PACKAGE).as_posix()}/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders <= set(drawn), f"not drawn: {sorted(folders - set(drawn))}"
    # Every drawn name is a file or folder of the checkout, under the nearest folder drawn above it.
    parents: list[tuple[int, Path]] = [(-1, ROOT)]
    for line in tree:
        if not line.strip():
            continue
        name = re.match(r"[\s│├└─]*(\S+)", line).group(1)
        depth = len(line) - len(line.lstrip(" │├└─"))
        while parents[-1][0] >= depth:
            parents.pop()
        path = parents[-1][1] / name.rstrip("/")
        assert path.exists(), f"docs/architecture.md's layout draws {name} under {parents[-1][1].relative_to(ROOT)}/, which has no such path"
        if name.endswith("/"):
            parents.append((depth, path))


def test_the_shared_primitives_take_no_family_option():
    """A family's quirk is a subclass in its family file, not an option every family's layers carry."""
    import inspect

    from coreai_partitioner.blocks import Attention, Block, GatedDeltaNet, GatedMLP, MoE

    general = {
        Attention: {"path", "shape", "q", "k", "v", "o", "context", "dtype", "scale", "q_norm", "k_norm", "rope", "rope_dims", "window", "spare"},
        MoE: {"router", "gate_up", "down", "top_k", "renormalize", "act"},
        Block: {"mixer", "mlp", "pre_attn", "post_attn", "pre_mlp", "post_mlp"},
        GatedMLP: {"act", "gate", "up", "down"},
        GatedDeltaNet: {"module", "dtype"},
    }
    for primitive, parameters in general.items():
        taken = set(inspect.signature(primitive.__init__).parameters) - {"self"}
        assert taken == parameters, (
            f"{primitive.__name__} takes {sorted(taken - parameters)} beyond its general math: make the family's "
            f"quirk a subclass in text_decoder/families/<family>.py (kind= to Build.attention / Build.moe)"
        )


#: The command line's own modules: the export command, its flags, detection and the task contract.  Only a task's
#: module (``cli/tasks/``, and ``cli/text_encoders.py``, the steps two of them share) enters a task's room.
COMMAND_MODULES = ("command", "detect", "export", "flags", "main", "task")


@pytest.mark.parametrize("name", COMMAND_MODULES)
def test_the_export_command_enters_no_tasks_room(name):
    module = f"coreai_partitioner.cli.{name}"
    rooms = sorted(n for n in imported(module, modules()[module]) if stage_of(n) in TASK_ROOMS)
    assert not rooms, f"{module} imports {rooms}: a task's module declares what the command needs of it"


def test_no_file_of_the_command_line_is_over_400_lines():
    long = {p.relative_to(ROOT).as_posix(): n for p in (PACKAGE / "cli").rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"over 400 lines: {long}"


def test_the_old_name_of_the_text_generation_room_still_imports_with_a_deprecation_warning():
    import coreai_partitioner
    from coreai_partitioner import text_generation

    with pytest.warns(DeprecationWarning, match="coreai_partitioner.text_generation"):
        from coreai_partitioner import llm
    assert llm is text_generation and llm.lower_decoder is text_generation.lower_decoder
    assert "text_generation" in dir(coreai_partitioner)
