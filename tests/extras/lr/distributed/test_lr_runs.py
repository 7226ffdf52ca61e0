"""Issue 13 from the command line: the learning rate scaled, warmed up and logged by ``fit``, and shown by ``plan``."""

from __future__ import annotations

import json

import pytest

from helpers import DIGITS, FAST, read_plan, read_scalars, run_cli, run_dirs


def test_the_learning_rate_is_scaled_warmed_up_and_logged(tmp_path):
    args = ["fit", "--config", DIGITS, "--config", FAST, "--parallel.learning_rate.lr_scaling", "linear"]
    args += ["--parallel.learning_rate.reference_batch_size", "32", "--parallel.learning_rate.warmup_steps", "4"]
    args += ["--trainer.max_steps", "6", "--trainer.log_every_n_steps", "1", "--test_after_fit", "false"]
    args += ["--trainer.limit_val_batches", "1"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    assert read_plan(run)["learning_rate"] == {
        "scaling": "linear",
        "reference_batch_size": 32,
        "factor": 2.0,
        "warmup_steps": 4,
        "lr": {"configured": 0.003, "scaled": 0.006},
    }
    # digits.yaml's AdamW lr 0.003, x 2 for the global batch of 64 against 32, reached after 4 warmup steps.
    logged = [value for _, value in read_scalars(run)["train/lr"]]
    assert logged == pytest.approx([0.0015, 0.003, 0.0045, 0.006, 0.006, 0.006], rel=1e-6)


def test_plan_shows_the_scaled_learning_rate_of_the_global_batch(tmp_path):
    args = ["plan", "--config", DIGITS, "--assume_gpus", "8", "--parallel.scenario", "ddp", "--json"]
    args += ["--parallel.global_batch_size", "1024", "--parallel.per_device_batch_size", "32"]
    args += ["--parallel.learning_rate.lr_scaling", "sqrt", "--parallel.learning_rate.reference_batch_size", "256"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    plan = json.loads(result.stdout)
    assert plan["learning_rate"]["factor"] == 2.0
    assert plan["learning_rate"]["lr"] == {"configured": 0.003, "scaled": 0.006}
    assert "learning rates x 2 (sqrt: global batch 1024 against the reference 256)" in plan["notes"]
