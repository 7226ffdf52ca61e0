"""The core's shape, proven on the source (issue 35): one home for scenarios, degrees and private names.

- A scenario's facts live in its row (``project/plan/scenarios.py``) and a strategy's in its row
  (``project/plan/strategies.py``): no other module compares a scenario or a strategy with a string.
- The degrees travel as the frozen :class:`project.plan.layout.Layout`: no signature takes or returns a
  ``dict[str, int]`` of degrees.
- Every private torch/Lightning name is used in ``project/lightning_private.py`` only (its docstring says why each
  is needed and what public API is missing).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "project"
TABLES = {PACKAGE / "plan" / "scenarios.py", PACKAGE / "plan" / "strategies.py"}
PRIVATE_HOME = PACKAGE / "lightning_private.py"
#: Private names of the standard library (``os._exit``, ``sys._current_frames``, a namedtuple's ``_fields``).
STDLIB_PRIVATE = {"_exit", "_current_frames", "_fields", "_replace", "_asdict", "_make"}


def sources() -> dict[Path, ast.Module]:
    """Every module of the package, parsed."""
    return {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def _constants(node: ast.expr) -> list[str]:
    """The string constants of a comparison's operand (a tuple/list/set of them too)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for element in node.elts for c in _constants(element)]
    return []


def _names_a_scenario(node: ast.expr) -> bool:
    """An operand that holds a scenario or strategy name: ``scenario``, ``plan.scenario``, ``config.strategy``..."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return "scenario" in name.lower() or "strategy" in name.lower()


def scenario_comparisons(tree: ast.Module) -> list[tuple[int, str]]:
    """Each comparison (``==``, ``!=``, ``in``, ``not in``, ``match``) of a scenario or strategy with a string."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = (node.left, *node.comparators)
            if any(map(_names_a_scenario, operands)):
                found += [(node.lineno, name) for operand in operands for name in _constants(operand)]
        elif isinstance(node, ast.Match) and _names_a_scenario(node.subject):
            found += [
                (case.pattern.lineno, name)
                for case in node.cases
                for sub in ast.walk(case.pattern)
                if isinstance(sub, ast.MatchValue)
                for name in _constants(sub.value)
            ]
    return found


def test_no_module_compares_with_a_scenario_name_outside_the_tables():
    found = {
        f"{path.relative_to(ROOT)}:{line} compares with {name!r}": None
        for path, tree in sources().items()
        if path not in TABLES
        for line, name in scenario_comparisons(tree)
    }
    assert not found, "a scenario's fact belongs in its row (project/plan/scenarios.py): " + ", ".join(found)


def _is_int_dict(annotation: ast.expr | None) -> bool:
    """``dict[str, int]`` or ``Mapping[str, int]`` (any module path), the shape of a dict of degrees."""
    if not isinstance(annotation, ast.Subscript):
        return False
    base = annotation.value
    name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
    args = annotation.slice
    return (
        name in {"dict", "Dict", "Mapping", "MutableMapping"}
        and isinstance(args, ast.Tuple)
        and [getattr(a, "id", None) for a in args.elts] == ["str", "int"]
    )


def test_no_signature_passes_degrees_as_a_dict():
    found = []
    for path, tree in sources().items():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            typed = [(a.arg, a.annotation) for a in arguments] + [("return", node.returns)]
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({name})"
                for name, annotation in typed
                if "degree" in name.lower() or ("degree" in node.name.lower() and _is_int_dict(annotation))
                if _is_int_dict(annotation) or name.lower() in {"degrees", "degree_map"}
            ]
    assert not found, "degrees travel as a Layout (project/plan/layout.py), not a dict: " + ", ".join(found)


def _defined_names(trees: dict[Path, ast.Module]) -> set[str]:
    """The private names the package defines itself: functions, classes, module names, ``self``/``cls`` attributes."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in {"self", "cls"}:
                    names.add(node.attr)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in STDLIB_PRIVATE


def foreign_private_names(tree: ast.Module, defined: set[str]) -> list[tuple[int, str]]:
    """Private names of torch/Lightning a module uses: imports, attributes and attribute names given as strings."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = getattr(node, "module", None) or ""
            for alias in node.names:
                path = f"{module}.{alias.name}" if module else alias.name
                parts = path.split(".")
                if parts[0] in {"torch", "lightning", "lightning_fabric"} and any(map(_private, parts)):
                    found.append((node.lineno, path))
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in defined:
            found.append((node.lineno, node.attr))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.isidentifier()
            and _private(node.value)
            and node.value not in defined
        ):
            found.append((node.lineno, node.value))
    return found


def test_every_private_torch_or_lightning_name_is_in_lightning_private():
    trees = sources()
    defined = _defined_names(trees)
    found = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path, tree in trees.items()
        if not is_private_home(path)
        for line, name in foreign_private_names(tree, defined)
    ]
    assert not found, (
        "move each into project/lightning_private.py (a layer's own: project/extras/<layer>/lightning_private.py) "
        "with why it is needed: " + ", ".join(found)
    )


def is_private_home(path: Path) -> bool:
    """The core's ``lightning_private.py``, or a layer's own (``project/extras/<layer>/lightning_private.py``)."""
    parts = path.relative_to(PACKAGE).parts
    return path == PRIVATE_HOME or (len(parts) == 3 and parts[0] == "extras" and parts[2] == PRIVATE_HOME.name)


def test_the_checks_find_what_they_look_for():
    """Each check flags the shape it forbids (so a passing test is not a check that cannot fail)."""
    compared = ast.parse('if plan.scenario == "fsdp" or strategy in ("ddp", "x") or kind == "cpu":\n    pass\n')
    assert [name for _, name in scenario_comparisons(compared)] == ["fsdp", "ddp", "x"]
    signature = ast.parse("def f(layout, degrees: dict[str, int]) -> None: ...\n")
    node = signature.body[0]
    assert isinstance(node, ast.FunctionDef) and _is_int_dict(node.args.args[1].annotation)
    private = ast.parse(
        "from torch.distributed.distributed_c10d import _get_default_store\n"
        "optimizer._opt_called = True\nself._mine = 1\nx = self._mine\n"
    )
    names = [name for _, name in foreign_private_names(private, _defined_names({Path("x"): private}))]
    assert names == ["torch.distributed.distributed_c10d._get_default_store", "_opt_called"]
    assert is_private_home(PACKAGE / "extras" / "guards" / "lightning_private.py")
    assert not is_private_home(PACKAGE / "extras" / "guards" / "deeper" / "lightning_private.py")
    assert not is_private_home(PACKAGE / "callbacks" / "lightning_private.py")
