"""The CLI as a user runs it: subcommands, the main job's accuracy, testing from a checkpoint, run directories."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch

from project.data.arrays import load_digits_tensors, seeded_split, split_sizes

from helpers import CONFIGS, DIGITS, FAST, assert_clean_error, read_plan, read_scalars, run_cli, run_dirs, two_at_a_time


def test_help_lists_the_subcommands(tmp_path):
    result = run_cli(["--help"], tmp_path)
    assert result.returncode == 0
    for name in ("fit", "validate", "test", "predict", "plan"):
        assert name in result.stdout


def test_fast_dev_run_fit(tmp_path):
    result = run_cli(["fit", "--config", DIGITS, "--trainer.fast_dev_run", "true"], tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_main_job_reaches_accuracy_and_test_from_checkpoint_reproduces_it(tmp_path):
    fit = run_cli(["fit", "--config", DIGITS], tmp_path)
    assert fit.returncode == 0, fit.stderr
    (run,) = run_dirs(tmp_path)
    assert f"Run directory: logs/digits/{run.name}" in fit.stdout
    scalars = read_scalars(run)
    for tag in ("train/loss", "val/loss", "val/acc", "test/acc"):
        assert tag in scalars, sorted(scalars)
    logged = scalars["test/acc"][-1][1]
    assert logged >= 0.95
    assert (run / "config.yaml").is_file() and read_plan(run)["world_size"] == 1
    assert (run / "checkpoints" / "last.ckpt").is_file()
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    # Checkpoints load under torch's default weights_only=True: no pickled modules in hyperparameters.
    torch.load(best, weights_only=True)

    again = []
    for _ in range(2):
        test = run_cli(["test", "--config", DIGITS, "--ckpt_path", str(best)], tmp_path)
        assert test.returncode == 0, test.stderr
        again.append(read_scalars(run_dirs(tmp_path)[-1])["test/acc"][-1][1])
    assert again[0] == again[1]
    assert again[0] == pytest.approx(logged, abs=1e-6)

    predict = run_cli(["predict", "--config", DIGITS, "--ckpt_path", str(best)], tmp_path)
    assert predict.returncode == 0, predict.stderr
    rows = (run_dirs(tmp_path)[-1] / "predictions.csv").read_text().splitlines()
    assert rows[0] == "index,prediction" and len(rows) == 1 + 270
    labels = digits_test_labels()
    correct = sum(int(row.split(",")[1]) == label for row, label in zip(rows[1:], labels))
    assert correct / len(labels) == pytest.approx(logged, abs=1e-6)


def digits_test_labels() -> list[int]:
    x, y = load_digits_tensors()
    return seeded_split(x, y, split_sizes(len(x), 0.15, 0.15), seed=0)[2].tensors[1].tolist()


def test_two_runs_in_a_row_make_two_versions(tmp_path):
    args = ["fit", "--config", DIGITS, "--config", FAST, "--trainer.max_epochs", "1", "--test_after_fit", "false"]
    for _ in range(2):
        result = run_cli(args, tmp_path)
        assert result.returncode == 0, result.stderr
    assert [p.name for p in run_dirs(tmp_path)] == ["version_0", "version_1"]
    assert all((p / "config.yaml").is_file() and (p / "plan.json").is_file() for p in run_dirs(tmp_path))


def test_plan_json_is_one_object_on_stdout(tmp_path):
    result = run_cli(["plan", "--config", DIGITS, "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["scenario"] == "cpu" and data["world_size"] == 1
    assert not (tmp_path / "logs").exists()


def write(path, text):
    path.write_text(text)
    return str(path)


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
    assert ddp["strategy"]["name"] == "ddp" and ddp["strategy"]["broadcast_buffers"] is False
    assert_clean_error(bad, "16", "15 or 18")
