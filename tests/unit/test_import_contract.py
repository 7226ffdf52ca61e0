"""The house's import contract: each room imports only from the rooms below it, and no module imports itself back.

The floors, bottom to top, are the layering of docs/development.md ("Rooms and floors"): what is pure (``plan``)
sits under what starts processes (``launch``), which sits under what runs inside them (``parallel``), and nothing
below the command line imports the command line. Every import counts, also one inside a function: a lazy
import back up is still a tie back up.
"""

from __future__ import annotations

import ast
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
    ("project.launch", "project.commands"),
    # Run records and checkpoints in object storage (fsspec URL, commit-then-point, lease): under every writer.
    ("project.storage",),
    # The run's state (section, plan, loaders' guarantees): made by the builder, read by the callbacks.
    ("project.lightning_private", "project.runs", "project.run_guard", "project.run_lock", "project.run_state"),
    ("project.checkpoints",),
    ("project.parallel",),
    (
        "project.export_program",
        "project.program_inputs",
        "project.program_check",
        "project.export",
        "project.models",
    ),
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


def project_imports(path: Path) -> list[tuple[str, int]]:
    """The imports of ``path`` that name a module of the project (a name imported from a module counts as it)."""
    result: dict[str, int] = {}
    for target, line in imports_of(path):
        while target and target not in MODULES:
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


def test_no_import_circle() -> None:
    graph = {name: {t for t, _ in project_imports(path) if t != name} for name, path in MODULES.items()}
    # A package's __init__ that only hands names on is not a module of its own for this purpose.
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
    assert circles == []


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
