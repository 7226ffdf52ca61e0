"""The commands are one table (project/commands.py): the code reads each command's row, not its name.

An AST count proves that the command's name is (almost) never compared with a string outside the table; the rows'
facts are checked here (the early layer's tests check which commands its pre-parse forks ranks for), and in
tests/cli/test_command_facts.py against what the commands do in real runs (their options, the run lock, tracking,
the test after fit, predictions, what plan and check leave behind).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from project.commands import COMMANDS, CORE_COMMANDS, Builds, command_of, split_command
from project.errors import UserError
from project.layers import installed

ROOT = Path(__file__).resolve().parents[2]
#: The most comparisons of a command name with a string the house allows outside project/commands.py.
MOST_OUTSIDE_THE_TABLE = 3


def _strings(node: ast.AST) -> set[str]:
    """The string constants ``node`` is, or holds as a tuple/list/set display."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _lightning_stage(node: ast.AST) -> bool:
    """Lightning's own stage (a hook's ``stage`` argument, ``trainer.state.fn``): its words, not our commands."""
    if isinstance(node, ast.Name):
        return node.id == "stage"
    return isinstance(node, ast.Attribute) and node.attr == "fn" and getattr(node.value, "attr", None) == "state"


def command_comparisons(source: str, where: str = "<source>") -> list[str]:
    """Each ``==``/``!=``/``in``/``not in`` of a command name as a string constant in ``source``, as ``where:line``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        left = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            named = (_strings(left) | _strings(right)) & set(COMMANDS)
            subject = right if _strings(left) else left
            if isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) and named and not _lightning_stage(subject):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
            left = right
    return found


def test_the_count_finds_each_way_of_comparing_a_command_name():
    """The counter can fail: the forms the code used before the table are each found; Lightning's stage is not."""
    before = """
if command == "fit": pass
if self.command not in ("plan", "predict"): pass
if sys.argv[1:2] == ["test"]: pass
if "validate" != name: pass
if stage == "fit" or trainer.state.fn == "validate": pass
if name == "fitness" or row.trains: pass
"""
    assert [line.split(": ", 1)[1] for line in command_comparisons(before)] == [
        "command == 'fit'",
        "self.command not in ('plan', 'predict')",
        "sys.argv[1:2] == ['test']",
        "'validate' != name",
    ]


def test_at_most_three_comparisons_of_a_command_name_outside_the_table():
    found = []
    for path in sorted((ROOT / "project").rglob("*.py")):
        if path != ROOT / "project" / "commands.py":
            found += command_comparisons(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert len(found) <= MOST_OUTSIDE_THE_TABLE, "read the command's row instead:\n" + "\n".join(found)


def test_every_command_has_one_row_and_the_help_lists_them():
    core = ["fit", "validate", "test", "predict", "plan"]
    layers = [row.name for layer in installed() for row in layer.commands]  # check, consolidate, sweep: layers' rows
    assert list(COMMANDS) == [*core, *layers] and list(CORE_COMMANDS) == [COMMANDS[name] for name in core]
    assert all(row.name == name for name, row in COMMANDS.items())
    row, rest = split_command(["predict", "--config", "x.yaml"])
    assert (row, rest) == (COMMANDS["predict"], ["--config", "x.yaml"])
    assert command_of([]) is None and command_of(["--help"]) is None
    with pytest.raises(UserError, match=r"unknown command 'train'; use one of fit, validate, test, predict, plan"):
        split_command(["train"])


def test_only_fit_trains_locks_tracks_tests_after_and_stops_on_a_signal():
    """The facts the old if-chains asked of ``fit`` alone."""
    for fact in ("trains", "locks_run", "tracks", "tests_after", "stops_on_signal"):
        assert [name for name, row in COMMANDS.items() if getattr(row, fact)] == ["fit"], fact
    assert [name for name, row in COMMANDS.items() if row.steps_optimizer and not row.self_test] == ["fit"]
    assert [name for name, row in COMMANDS.items() if row.evaluates] == ["validate", "test", "predict"]
    assert [name for name, row in COMMANDS.items() if row.trainer_method == "predict"] == ["predict"]
    assert {row.builds for row in CORE_COMMANDS if not row.builds_trainer} == {Builds.MODEL_AND_DATA}
    assert all(row.runner is not None for row in COMMANDS.values() if row.builds in (Builds.FILES, Builds.DRIVER))


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_may_have_its_ranks_started_early_exactly_when_it_builds_a_trainer(name):
    assert COMMANDS[name].starts_ranks_early == COMMANDS[name].builds_trainer
