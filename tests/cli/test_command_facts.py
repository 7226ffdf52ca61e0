"""Each row of the command table (project/commands.py) says what its command does: checked on real runs.

One small training (fit, with a user's probe callback), then validate, test and predict of its ``last``
checkpoint, and plan, all as a user types them (forked from the pre-imported CLI):
the probe (tests/command_probe.py) notes at each Trainer entry point whether the process holds the run's lock, and
which of the template's callbacks the command added; the files each command leaves are compared with its row.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from project.commands import COMMANDS, Builds
from project.layers import hook

from helpers import DIGITS, FAST, assert_clean_error, has_layer, run_cli

SMALL = ["--config", DIGITS, "--config", FAST, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2"]
SMALL += [
    "--trainer.limit_val_batches",
    "1",
    "--trainer.limit_test_batches",
    "1",
    "--trainer.limit_predict_batches",
    "1",
]
PROBE = ["--trainer.callbacks+=command_probe.CommandProbe"]
EVALUATIONS = ("validate", "test", "predict")


def _facts(cwd: Path) -> list[dict]:
    """The probe's notes of the last command, taken (the next command starts a new file)."""
    path = cwd / "facts.jsonl"
    notes = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    path.unlink(missing_ok=True)
    return notes


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    """The probe's notes of fit, then validate, test and predict of its last checkpoint (one run folder)."""
    cwd = tmp_path_factory.mktemp("commands")
    notes = {}
    for name in ("fit", *EVALUATIONS):
        extra = ["--ckpt_path", "last"] if name != "fit" else []
        result = run_cli([name, *SMALL, *PROBE, *extra], cwd)
        assert result.returncode == 0, result.stderr[-3000:]
        notes[name] = _facts(cwd)
    notes["files"] = [str(path.relative_to(cwd)) for path in sorted(cwd.rglob("*"))]
    return notes


def test_fit_trains_holds_the_lock_stops_on_a_signal_and_tests_after(runs):
    row = COMMANDS["fit"]
    fit, *after = runs["fit"]
    assert fit["method"] == row.trainer_method and fit["ckpt_path"] is None
    # Tracking is a layer's, and only with its section (the tracking layer's tests add it): not on this run.
    assert (fit["locks_run"], fit["tracks"], fit["stops_on_signal"]) == (row.locks_run, False, row.stops_on_signal)
    assert not fit["writes_predictions"]
    assert [note["method"] for note in after] == (["test"] if row.tests_after else [])


@pytest.mark.parametrize("name", EVALUATIONS)
def test_an_evaluation_starts_from_the_checkpoint_and_holds_nothing(runs, name):
    row = COMMANDS[name]
    (note,) = runs[name]  # one entry point: nothing after it
    assert note["method"] == row.trainer_method
    assert row.takes_checkpoint and note["ckpt_path"].endswith("last.ckpt"), note
    assert (note["locks_run"], note["tracks"], note["stops_on_signal"]) == (row.locks_run, False, False)
    # The predictions layer adds its writer to predict alone (stripped: Lightning's predict writes no file).
    writes = has_layer("predictions") and row.trainer_method == "predict"
    assert note["writes_predictions"] == writes
    assert any(path.endswith("predictions.csv") for path in runs["files"]) == has_layer("predictions")


def test_an_evaluation_without_a_checkpoint_is_refused(tmp_path):
    assert COMMANDS["validate"].evaluates
    result = run_cli(["validate", *SMALL], tmp_path)
    assert_clean_error(result, "validate without --ckpt_path would evaluate the freshly initialised weights")
    assert not (tmp_path / "logs").exists()


def test_plan_builds_no_trainer_and_writes_nothing(tmp_path):
    row = COMMANDS["plan"]
    assert row.builds is Builds.MODEL_AND_DATA and not (row.locks_run or row.takes_checkpoint)
    result = run_cli(["plan", *SMALL, *PROBE], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(path.name for path in tmp_path.iterdir()) == [], "plan writes nothing, not even a run directory"


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter is intended")  # given on purpose, as cli.py does
@pytest.mark.parametrize("name", [name for name, row in COMMANDS.items() if row.builds is not Builds.FILES])
def test_each_commands_options_are_what_its_row_says(name, capsys):
    """``python -m project NAME --help``, in-process: the options a row's facts add, and only those."""
    if COMMANDS[name].runner is not None:  # a layer's driver (the sweep) parses its own options
        command = hook(COMMANDS[name].runner)
    else:
        from project.build import ProjectCLI

        def command(args: list[str]) -> None:
            ProjectCLI(name, args)

    with pytest.raises(SystemExit) as ended:
        command(["--help"])
    assert ended.value.code == 0
    shown = capsys.readouterr().out
    row = COMMANDS[name]
    assert ("--ckpt_path" in shown) == row.takes_checkpoint, shown
    assert ("--resume" in shown) == row.trains
    assert ("--test_after_fit" in shown) == row.tests_after
    assert ("--assume_gpus" in shown) == (row.builds is Builds.MODEL_AND_DATA)
    assert ("--trainer" in shown) == (row.builds is not Builds.DRIVER)
