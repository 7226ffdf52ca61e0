"""The CLI as a user runs it: subcommands, the main job's accuracy, testing from a checkpoint, run directories."""

from __future__ import annotations

import json
from functools import partial

import pytest

from helpers import CONFIGS, DIGITS, FAST, assert_clean_error, run_cli, run_dirs, two_at_a_time


@pytest.mark.fast
def test_help_lists_the_subcommands(tmp_path):
    result = run_cli(["--help"], tmp_path)
    assert result.returncode == 0
    for name in ("fit", "validate", "test", "predict", "plan"):
        assert name in result.stdout


@pytest.mark.fast
def test_fast_dev_run_fit(tmp_path):
    result = run_cli(["fit", "--config", DIGITS, "--trainer.fast_dev_run", "true"], tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.fast
def test_two_runs_in_a_row_make_two_versions(tmp_path):
    args = ["fit", "--config", DIGITS, "--config", FAST, "--trainer.max_epochs", "1", "--test_after_fit", "false"]
    for _ in range(2):
        result = run_cli(args, tmp_path)
        assert result.returncode == 0, result.stderr
    assert [p.name for p in run_dirs(tmp_path)] == ["version_0", "version_1"]
    assert all((p / "config.yaml").is_file() and (p / "plan.json").is_file() for p in run_dirs(tmp_path))


@pytest.mark.fast
def test_plan_json_is_one_object_on_stdout(tmp_path):
    result = run_cli(["plan", "--config", DIGITS, "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["scenario"] == "cpu" and data["world_size"] == 1
    assert not (tmp_path / "logs").exists()


def write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("make_args", "needles"),
    [
        (lambda tmp: ["fit", "--config", DIGITS, "--trainer.no_such_key", "1"], ["no_such_key"]),
        (lambda tmp: ["fit", "--config", str(tmp / "missing.yaml")], ["missing.yaml"]),
        (lambda tmp: ["fit", "--config", write(tmp / "broken.yaml", "trainer: [max_epochs: 1\n")], ["broken.yaml"]),
        (
            lambda tmp: ["test", "--config", DIGITS, "--ckpt_path", str(tmp / "nope.ckpt")],
            ["nope.ckpt", "does not exist"],
        ),
        (lambda tmp: ["fit", "--config", DIGITS, "--trainer.devices", "2"], ["trainer.devices", "parallel"]),
    ],
    ids=["unknown-key", "missing-config", "broken-yaml", "missing-ckpt", "trainer-and-parallel"],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, make_args, needles):
    result = run_cli(make_args(tmp_path), tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert_clean_error(result, *needles)
    assert not (tmp_path / "logs").exists()


def plan_json(tmp_path, *args: str) -> dict:
    result = run_cli(["plan", "--config", DIGITS, *args, "--assume_gpus", "8", "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_plan_for_the_seed_scenarios_on_8_gpus(tmp_path):
    parallel = CONFIGS / "parallel"
    dp_16 = ["--config", str(parallel / "dp_012.yaml"), "--parallel.global_batch_size", "16"]
    dp_all, dp_012, ddp, bad = two_at_a_time(
        *(
            partial(plan_json, tmp_path, "--config", str(parallel / f"{name}.yaml"))
            for name in ("dp_all", "dp_012", "ddp")
        ),
        partial(run_cli, ["plan", "--config", DIGITS, *dp_16, "--assume_gpus", "8", "--json"], tmp_path),
    )
    assert dp_all["world_size"] == 8 and dp_all["devices"] == list(range(8))
    assert dp_012["devices"] == [0, 1, 2] and dp_012["world_size"] == 3
    assert dp_012["per_device_batch_size"] == dp_012["global_batch_size"] // 3
    assert ddp["strategy"]["name"] == "ddp" and ddp["strategy"]["ddp"]["broadcast_buffers"] is False
    assert_clean_error(bad, "16", "15 or 18")
