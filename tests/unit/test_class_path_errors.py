"""A class path of the user's that does not import: one line naming the module and the cause (issue 44).

jsonargparse reports it as a value of the wrong type ("model=... is not LightningModule"); the parser's own
report, from the installed jsonargparse, is turned here into the import error the user can act on.
"""

from __future__ import annotations

import sys

import pytest
from lightning.pytorch import Callback, LightningModule

from project.config_errors import ProjectArgumentParser, class_path_failure
from project.dotted import import_failure

MODULES = {
    "waves1d.py": "import torch\n\n\nclass WaveModule(torch.nn.Module):\n    pass\n",
    "needs_dep.py": "import torch\nimport not_installed_dep_44\n",
    "broken_syntax.py": "x = 1\ndef f(:\n    pass\n",
    "raises_inside.py": "x = 1\nraise ValueError('bad setting')\n",
}


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """A working folder holding the user's modules, first on sys.path (as ``python -m project`` puts it)."""
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def parser_report(argv: list[str]) -> str:
    """The report jsonargparse gives for ``argv`` on a parser with a model and callbacks, as LightningCLI's."""
    parser = ProjectArgumentParser(exit_on_error=False)
    parser.add_lightning_class_args(LightningModule, "model", subclass_mode=True)
    parser.add_argument("--callbacks", type=list[Callback] | Callback | None, default=None)
    with pytest.raises(Exception) as raised:
        parser.parse_args(argv)
    return str(raised.value)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--model", "waves1d.WaveModul"],
            "--model waves1d.WaveModul: module waves1d (waves1d.py) has no class WaveModul; did you mean WaveModule?",
        ),
        (
            ["--model", "nowhere44.WaveModule"],
            "--model nowhere44.WaveModule: cannot import module nowhere44 (No module named 'nowhere44'); "
            "run python -m project from the folder that holds nowhere44/",
        ),
        (
            ["--model", "needs_dep.M"],
            "--model needs_dep.M: module needs_dep failed to import: ModuleNotFoundError: "
            "No module named 'not_installed_dep_44' (needs_dep.py:2)",
        ),
        (["--model", "broken_syntax.M"], "--model broken_syntax.M: module broken_syntax has a syntax error: "),
        (
            ['--model={"class_path": "raises_inside.M"}'],
            "--model raises_inside.M: module raises_inside failed to import: ValueError: bad setting "
            "(raises_inside.py:2)",
        ),
        (["--callbacks", "waves1d.NoCallback"], "--callbacks waves1d.NoCallback: module waves1d (waves1d.py) has no"),
    ],
    ids=["class-name-typo", "module-not-on-the-path", "missing-dependency", "syntax-error", "raises", "callback"],
)
def test_a_class_path_that_does_not_import_says_why(user_folder, argv, expected):
    assert class_path_failure(parser_report(argv), argv).startswith(expected)


def test_a_class_path_in_a_config_file_names_the_file(user_folder):
    (user_folder / "own.yaml").write_text("model:\n  class_path: raises_inside.M\n")
    argv = ["--config", "own.yaml"]
    report = "Parser key \"model\":\n  Errors:\n    - bad setting\n  Given value: {'class_path': 'raises_inside.M'}"
    assert class_path_failure(report, argv).startswith("model class_path raises_inside.M (in own.yaml): module")


def test_a_syntax_error_names_its_file_and_line(user_folder):
    assert import_failure("broken_syntax.M") == (
        "module broken_syntax has a syntax error: invalid syntax (broken_syntax.py:2); fix the file"
    )


def test_classes_that_import_and_other_reports_are_left_to_the_other_messages(user_folder):
    assert import_failure("waves1d.WaveModule") is None
    assert import_failure("torch.nn.Linear") is None
    assert class_path_failure(parser_report(["--model", "torch.nn.Linear"]), ["--model", "torch.nn.Linear"]) is None
    assert class_path_failure('Parser key "parallel": Expected a path but abc either not accessible', []) is None


def test_a_class_that_fails_in_its_init_is_named_with_its_own_error():
    """jsonargparse's 'Problem with given class_path ...:' keeps the class's exception on the next line or as cause."""
    from project.config_errors import root_cause

    try:
        try:
            raise AttributeError("property 'every_n_epochs' of 'TimedCheckpoint' object has no setter")
        except AttributeError as inner:
            raise ValueError("Problem with given class_path 'project.callbacks.TimedCheckpoint':") from inner
    except ValueError as error:
        assert root_cause(error) == (
            "Problem with given class_path 'project.callbacks.TimedCheckpoint': AttributeError: "
            "property 'every_n_epochs' of 'TimedCheckpoint' object has no setter"
        )
