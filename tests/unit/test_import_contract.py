"""The house's import contract: each room imports only from the rooms below it, and no module imports itself back.

The floors, bottom to top, are the layering of docs/development.md ("Rooms and floors"): what is pure (``plan``)
sits under what starts processes (``launch``), which sits under what runs inside them (``parallel``), and nothing
below the command line imports the command line. Every import counts, also one inside a function: a lazy
import back up is still a tie back up.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "project"

#: Bottom to top; a module may import from its own floor and the floors below. Longest prefix wins.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("project.errors", "project.config_errors", "project.parser_stubs", "project.data", "project.dotted"),
    # The tables read the layers' rows (project.layers lists project/extras/ on disk, naming no layer): the plan's
    # scenarios, strategies and parallel subsections, and the command table.
    ("project.layers",),
    ("project.plan",),
    # The command table (standard library only) reads the command line below anything that starts processes.
    ("project.launch",),
    ("project.commands",),
    # Where a run directory lives (the local disk, or a layer's store for URLs): under every writer.
    ("project.run_store",),
    # The run's state (section, plan, loaders' guarantees): made by the builder, read by the callbacks.
    ("project.lightning_private", "project.runs", "project.run_guard", "project.run_lock", "project.run_state"),
    ("project.checkpoints",),
    ("project.parallel",),
    ("project.export", "project.models"),
    ("project.callbacks",),
    ("project.run_config",),
    ("project.build",),
    ("project.plan_command",),
    ("project.cli",),
    ("project.__main__",),
    # The layers: each may import the core, any floor of it; the core never imports them (test_core_shape).
    ("project.extras",),
)
#: Rooms whose modules must not import one another's floors at all, whatever the order (the process boundary).
PURE_ROOM = "project.plan"
PURE_MAY_NOT_IMPORT = ("lightning", "torch.distributed")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[str, int]]:
    """Every absolute or relative import of ``path`` (module, line), including those inside functions."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((target, node.lineno))
            # `from project.x import y` may import the module project.x.y
            found += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
    return found


def floor_of(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def project_imports(path: Path, modules: dict[str, Path] | None = None) -> list[tuple[str, int]]:
    """The imports of ``path`` that name a module of the project (a name imported from a module counts as it)."""
    modules = MODULES if modules is None else modules
    result: dict[str, int] = {}
    for target, line in imports_of(path):
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target.startswith("project") and target != "project":
            result.setdefault(target, line)
    return sorted(result.items())


def test_every_module_has_a_floor() -> None:
    assert [m for m in MODULES if m != "project" and floor_of(m) is None] == []


def test_no_import_runs_back_up() -> None:
    back_up = []
    for name, path in MODULES.items():
        own = floor_of(name)
        for target, line in project_imports(path):
            there = floor_of(target)
            if own is not None and there is not None and there > own:
                back_up.append(f"{path.relative_to(ROOT)}:{line} imports {target} (floor {there} > {own})")
    assert back_up == []


def room_of(module: str) -> str | None:
    """The room of ``module``: the prefix of :data:`FLOORS` it belongs to (``project.launch``, ``project.commands``)."""
    rooms = [prefix for floor in FLOORS for prefix in floor if module == prefix or module.startswith(prefix + ".")]
    return max(rooms, key=len, default=None)


def room_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Room -> the other rooms its modules import."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own = room_of(name)
        if own is not None:
            targets = {room_of(target) for target, _ in project_imports(path, modules)}
            graph.setdefault(own, set()).update(room for room in targets if room not in (None, own))
    return graph


def find_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of ``graph`` (node -> the nodes it imports), as the path that closes it."""
    circles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return circles


def test_no_import_circle() -> None:
    graph = {name: {t for t, _ in project_imports(path) if t != name} for name, path in MODULES.items()}
    # A package's __init__ that only hands names on is not a module of its own for this purpose.
    assert find_circles(graph) == []


def test_no_circle_between_rooms() -> None:
    """Two rooms that import each other are tied both ways even where no module imports itself back.

    Rooms on one floor may import each other (the floor test allows it): project.commands imported
    project.launch.legacy while project.launch.preparse imported project.commands, a circle of rooms only.
    """
    assert find_circles(room_graph(MODULES)) == []


def test_a_circle_of_rooms_without_a_circle_of_modules_is_found(tmp_path: Path, monkeypatch) -> None:
    files = {
        "project/commands.py": "from project.launch.legacy import strip\n",
        "project/launch/__init__.py": "",
        "project/launch/legacy.py": "def strip():\n    pass\n",
        "project/launch/preparse.py": "from project.commands import COMMANDS\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    modules = {module_name(p): p for p in sorted((tmp_path / "project").rglob("*.py"))}
    graph = {name: {t for t, _ in project_imports(path, modules) if t != name} for name, path in modules.items()}
    assert find_circles(graph) == []  # no module imports itself back
    assert find_circles(room_graph(modules)) == [["project.commands", "project.launch", "project.commands"]]


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m == PURE_ROOM or m.startswith(PURE_ROOM + ".")))
def test_plan_is_pure(name: str) -> None:
    """``project.plan`` decides before any process exists: no Lightning, no process group."""
    bad = [
        f"line {line}: {target}"
        for target, line in imports_of(MODULES[name])
        if any(target == p or target.startswith(p + ".") for p in PURE_MAY_NOT_IMPORT)
    ]
    assert bad == []


def test_the_contract_can_fail(tmp_path: Path) -> None:
    """The checks above see an import back up: a lower module naming the CLI is found."""
    lower = tmp_path / "project" / "plan" / "x.py"
    lower.parent.mkdir(parents=True)
    lower.write_text("def f():\n    from project.cli import main\n")
    global ROOT
    saved = ROOT
    try:
        ROOT = tmp_path
        assert imports_of(lower) == [("project.cli", 2), ("project.cli.main", 2)]
        assert floor_of(module_name(lower)) < floor_of("project.cli")
    finally:
        ROOT = saved


def test_the_bench_has_no_import_circle() -> None:
    """bench/ (the harness, its tasks and reports): no module imports itself back, type-only imports included."""
    bench = {module_name(p): p for p in sorted((ROOT / "bench").rglob("*.py"))}
    graph = {}
    for name, path in bench.items():
        targets = set()
        for target, _ in imports_of(path):
            while target and target not in bench:
                target = target.rpartition(".")[0]
            if target and target != name and target != "bench":
                targets.add(target)
        graph[name] = targets
    assert find_circles(graph) == []
