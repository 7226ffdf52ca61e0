"""`python -m project sweep` with one-process trials: bad space files, a failed trial, pruning, the report.

One study of three short trials is shared by the asserts: trial 0 completes, trial 1 raises as it starts training
(recorded FAIL, the sweep goes on), trial 2 learns nothing and the median pruner stops it at its first validation.
While it runs, a second driver on the same study is refused. The driver runs under ``-X importtime``: it must import
neither torch nor Lightning.
"""

from __future__ import annotations

import csv
import subprocess
import time
from pathlib import Path

import pytest
from sweep_support import load_trials, processes_in, run_sweep, sweep_command, wait_until_gone, write_space

from helpers import DIGITS, FAST, assert_clean_error, cli_env, two_at_a_time

BASE = [DIGITS, FAST]
LR = {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True}
FAULTS = {"class_path": "sweep_support.TrialFaults", "init_args": {"fail": [1], "stall": [2]}}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Run the shared study to its end; a second driver tries the same study while trial 0 runs."""
    cwd = tmp_path_factory.mktemp("sweep")
    hidden = {"type": "categorical", "choices": [16, 32]}
    parameters = {"optimizer.init_args.lr": LR, "model.init_args.net.init_args.hidden": hidden}
    space = write_space(
        cwd / "faults.yaml",
        n_trials=3,
        seed=0,
        parameters=parameters,
        fixed={"trainer.callbacks+": FAULTS},
        pruner={"type": "median", "n_startup_trials": 1},
    )
    command = sweep_command(BASE, space)
    out, err = cwd / "driver.out", cwd / "driver.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        timed = [command[0], "-X", "importtime", *command[1:]]
        driver = subprocess.Popen(timed, cwd=cwd, env=cli_env(), stdout=stdout, stderr=stderr)
        deadline = time.monotonic() + 120
        while "Trial 0 started" not in out.read_text() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        second = run_sweep(command, cwd)
        code = driver.wait(timeout=600)
    return {"cwd": cwd, "code": code, "out": out.read_text(), "err": err.read_text(), "second": second}


def test_the_sweep_ends_and_its_driver_imports_no_training_library(study):
    assert study["code"] == 0, study["out"] + study["err"]
    imported = {line.split("|")[-1].strip() for line in study["err"].splitlines() if line.startswith("import time:")}
    # The driver itself is imported by the command row's runner (importlib: -X importtime shows its own imports only)
    assert "optuna" in imported and "project.extras.sweep.finish" in imported
    assert not {"torch", "lightning", "jsonargparse"} & imported


def test_a_second_driver_on_the_same_study_is_refused_in_one_line(study):
    second = study["second"]
    assert second.returncode == 2, second.stdout + second.stderr
    assert_clean_error(second, "is being run already")
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr


def test_a_failed_trial_is_recorded_with_its_error_and_the_sweep_goes_on(study):
    trials = load_trials(study["cwd"], "faults")
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "PRUNED"], study["out"]
    assert trials[1].user_attrs["error"] == "RuntimeError: injected fault in trial 1"
    assert "Trial 1 failed" in study["out"] and "injected fault in trial 1" in study["out"]


def test_pruning_stops_the_trial_at_its_first_validation_and_leaves_no_process(study):
    trials = load_trials(study["cwd"], "faults")
    complete, pruned = trials[0], trials[2]
    assert sorted(complete.intermediate_values) == [19, 38]  # 2 epochs of 19 steps, a validation after each
    assert sorted(pruned.intermediate_values) == [19]
    assert pruned.intermediate_values[19] < complete.intermediate_values[19]
    assert Path(study["cwd"], pruned.user_attrs["run_dir"], "checkpoints").is_dir()
    assert processes_in(study["cwd"]) == []


def test_the_report_the_csv_and_the_plots(study):
    folder, out = study["cwd"] / "logs" / "sweeps" / "faults", study["out"]
    rows = list(csv.DictReader((folder / "trials.csv").open()))
    assert [(row["number"], row["state"]) for row in rows] == [("0", "COMPLETE"), ("1", "FAIL"), ("2", "PRUNED")]
    assert rows[1]["error"] == "RuntimeError: injected fault in trial 1"
    assert (folder / "optimization_history.png").stat().st_size > 1000
    assert "param_importances.png skipped: it needs 2 completed trials, 1 so far" in out
    assert "Best trial: 0" in out and "run directory: logs/sweeps/faults/trial_0/version_0" in out
    location = "Study faults: logs/sweeps/faults (storage sqlite:///"
    assert out.startswith(location) and out.count(location) == 2


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"optimizer.init_args.lr": {"type": "normal", "low": 0.1, "high": 1.0}}, "unknown type 'normal'"),
        ({"optimizer.init_args.lr": {"type": "float", "low": 0.1, "high": 0.01}}, "low 0.1 must be below high 0.01"),
        ({"optimizer.init_args.lr": {"type": "float", "low": 0.1}}, "missing `high`"),
        ({"optimizer.init_args.lr": {"low": 0.1, "high": 1.0}}, "missing `type`"),
    ],
    ids=["unknown-type", "low-above-high", "missing-high", "missing-type"],
)
def test_a_bad_space_file_is_one_line_before_any_trial(tmp_path, entry, needle):
    result = run_sweep(sweep_command(BASE, write_space(tmp_path / "bad.yaml", parameters=entry)), tmp_path)
    _refused_before_any_trial(result, tmp_path, needle)


def test_a_key_the_base_config_cannot_take_and_a_missing_space_are_one_line(tmp_path):
    unknown = write_space(tmp_path / "typo.yaml", parameters={"optimizer.init_args.learning_rate": LR})
    results = two_at_a_time(
        lambda: run_sweep(sweep_command(BASE, unknown), tmp_path),
        lambda: run_sweep(sweep_command(BASE, tmp_path / "missing.yaml", "--study", "other"), tmp_path),
    )
    _refused_before_any_trial(results[0], tmp_path, "does not take the sweep's keys", "learning_rate")
    _refused_before_any_trial(results[1], tmp_path, "cannot read the sweep space")


def _refused_before_any_trial(result: subprocess.CompletedProcess[str], cwd: Path, *needles: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert_clean_error(result, *needles)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not list(cwd.glob("logs/sweeps/*/trial_*")), "a trial started"
    assert wait_until_gone(cwd) == []
