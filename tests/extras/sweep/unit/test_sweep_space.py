"""The sweep's pure parts: the space file's rules, the trial's result file, values on the command line."""

from __future__ import annotations

import math

import pytest
import yaml

from project.errors import UserError
from project.extras.sweep.contract import TrialResult, TrialSpec
from project.extras.sweep.setup import format_value, override_args
from project.extras.sweep.space import read_space

from helpers import REPO

LR = {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True}


def space(tmp_path, **entries):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(entries))
    return read_space(path)


def test_the_example_space_reads_with_its_distributions():
    example = read_space(REPO / "configs" / "sweep" / "digits.yaml")
    assert example.metric is None and example.direction is None  # the base config's monitor decides
    assert example.fixed == {"trainer.max_epochs": 5, "lr_scheduler.init_args.T_max": 5}
    distributions = example.distributions()
    assert distributions["optimizer.init_args.lr"].log and distributions["optimizer.init_args.lr"].low == 1.0e-4
    assert list(distributions["model.init_args.net.init_args.hidden"].choices) == [64, 128, 256]
    assert example.pruner.build().__class__.__name__ == "MedianPruner"


def test_yaml_1_1_exponents_without_a_dot_are_numbers(tmp_path):
    given = {"optimizer.init_args.lr": {"type": "float", "low": "1e-4", "high": 1}}
    (parameter,) = space(tmp_path, parameters=given).parameters
    assert parameter.low == 1.0e-4 and parameter.high == 1.0


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        ({"parameters": {}}, "`parameters` is missing or empty"),
        ({"parameters": {"a.b": LR}, "budget": 3}, "unknown entry budget"),
        ({"parameters": {"a.b": {"type": "uniform", "low": 0, "high": 1}}}, "unknown type 'uniform'"),
        ({"parameters": {"a.b": {"type": "float", "low": 1, "high": 0.5}}}, "low 1.0 must be below high 0.5"),
        ({"parameters": {"a.b": {"type": "float", "low": 0, "high": 1, "log": True}}}, "a log scale needs low > 0"),
        ({"parameters": {"a.b": {"type": "int", "low": 0.5, "high": 4}}}, "must be an integer"),
        ({"parameters": {"a.b": {"type": "int", "low": 1}}}, "missing `high`"),
        ({"parameters": {"a.b": {"type": "categorical"}}}, "missing `choices`"),
        ({"parameters": {"a.b": {"type": "categorical", "choices": [1, 1]}}}, "choices repeat a value"),
        ({"parameters": {"a.b": {"type": "float", "low": 0, "high": 1, "choices": [1]}}}, "choices is not a setting"),
        ({"parameters": {"a b": LR}}, "is not a dotted config key"),
        ({"parameters": {"trainer.logger.init_args.name": LR}}, "set by the sweep itself"),
        ({"parameters": {"a.b": LR}, "fixed": {"a.b": 1}}, "both searched (parameters) and fixed"),
        ({"parameters": {"a.b": LR}, "direction": "up"}, "direction: 'up' must be one of"),
        ({"parameters": {"a.b": LR}, "n_trials": 0}, "n_trials: 0 must be an integer >= 1"),
        ({"parameters": {"a.b": LR}, "pruner": {"type": "hyperband"}}, "pruner: unknown type 'hyperband'"),
        ({"parameters": {"a.b": LR}, "pruner": {"patience": 2}}, "pruner: unknown setting patience"),
    ],
)
def test_a_bad_space_is_one_line_naming_the_file(tmp_path, entries, needle):
    with pytest.raises(UserError) as refused:
        space(tmp_path, **entries)
    message = str(refused.value)
    assert needle in message and str(tmp_path / "space.yaml") in message and "\n" not in message


def test_fixed_keys_may_append_to_a_list(tmp_path):
    fixed = {"trainer.callbacks+": {"class_path": "x.Y"}}
    assert space(tmp_path, parameters={"a.b": LR}, fixed=fixed).fixed == fixed


def test_values_on_the_command_line():
    written = [format_value(value) for value in (None, True, 3, 1e-05, "relu", [1, 2])]
    assert written == ["null", "true", "3", "1e-05", "relu", "[1, 2]"]
    appended = override_args({"trainer.callbacks+": {"class_path": "x.Y"}})
    assert appended == ['--trainer.callbacks+={"class_path": "x.Y"}']


def test_the_result_file_round_trips_and_its_best_skips_non_finite_values(tmp_path):
    result = TrialResult("val/loss", {19: 0.5, 38: math.nan, 57: 0.25}, run_dir="logs/x/version_0")
    result.write(tmp_path / "result.json")
    back = TrialResult.read(tmp_path / "result.json")
    assert back is not None and back.values[57] == 0.25 and back.run_dir == "logs/x/version_0"
    assert back.best(maximize=False) == 0.25 and back.best(maximize=True) == 0.5
    assert TrialResult.read(tmp_path / "missing.json") is None
    assert TrialResult("val/acc").best(maximize=True) is None


def test_the_trial_spec_travels_in_the_environment():
    spec = TrialSpec("sqlite:////x/study.db", "digits", 3, "val/acc", "/x/result.json", {"type": "median"})
    assert TrialSpec.from_env({"PROJECT_SWEEP_TRIAL": spec.to_env()}) == spec
    assert TrialSpec.from_env({}) is None
