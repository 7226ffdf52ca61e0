"""The usual multi-process mistakes of user code: one ``error:`` line naming the template's setting, exit code 2.

- Parameters that get no gradient under DDP (a head never trained, a loss a schedule drops): named after the
  first backward, before the first optimizer step (nothing left behind), or at the step DDP notices it.
- ``trainer.strategy: ddp_find_unused_parameters_true`` beside a ``parallel`` section.
- Manual optimization with gradient accumulation: refused by ``fit`` before any process starts, and by ``plan``.
- ``LearningRateFinder`` on 2 processes (it would tune on rank 0's half of each global batch).

Every case is a real CLI run (2 CPU processes over gloo where it trains), two at a time.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import partial
from pathlib import Path

import pytest

from helpers import CPU_DDP, DIGITS, FAST, run_cli, two_at_a_time

SHORT = ["--trainer.limit_train_batches", "2", "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "1"]
FIT = ["fit", "--config", DIGITS, "--config", FAST, *SHORT, "--test_after_fit", "false"]
DDP_HEADS = ["--config", CPU_DDP, "--model.class_path", "user_code.PartlyUsedHeads"]
GAN = ["--config", CPU_DDP, "--model", "user_code.ManualGAN"]
SETTING = "`parallel.ddp.find_unused_parameters: true`"
CASES = {
    "head-never-trained": [*FIT, *DDP_HEADS],
    "head-dropped-after-step-1": [
        *FIT, *DDP_HEADS, "--model.init_args.aux_until_step", "1", "--trainer.limit_train_batches", "3",
    ],
    "head-never-trained-find-unused": [*FIT, *DDP_HEADS, "--parallel.ddp.find_unused_parameters", "true"],
    "check-head-never-trained": ["check", "--config", DIGITS, *DDP_HEADS, "--steps", "1"],
    "trainer-strategy-find-unused": [*FIT, "--trainer.strategy", "ddp_find_unused_parameters_true"],
    "manual-accumulation-fit": [*FIT, *GAN, "--parallel.accumulation", "2"],
    "lr-finder-on-two-processes": [
        *FIT, "--config", CPU_DDP, "--trainer.callbacks+=lightning.pytorch.callbacks.LearningRateFinder",
    ],
    "manual-accumulation-plan": [
        "plan", "--config", DIGITS, *GAN, "--parallel.global_batch_size", "128",
        "--parallel.per_device_batch_size", "32",
    ],
}  # fmt: skip


def run_case(root: Path, name: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run one case in a folder of its own: its result and the folder."""
    cwd = root / name
    cwd.mkdir()
    return run_cli(CASES[name], cwd, timeout=240), cwd


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """Every case, two at a time (about a minute on 2 cores)."""
    root = tmp_path_factory.mktemp("mistakes")
    return dict(zip(CASES, two_at_a_time(*(partial(run_case, root, name) for name in CASES)), strict=True))


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The run's only ``error:`` line (any rank's), after checking exit code 2 and no traceback."""
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in result.stderr.splitlines() if re.match(r"(\[rank \d+\] )?error: ", line)]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr[-3000:]
    return errors[0]


@pytest.mark.timeout(600)
def test_a_parameter_without_gradient_under_ddp_is_one_line_before_the_first_step(outcomes):
    result, cwd = outcomes["head-never-trained"]
    error = one_error_line(result)
    assert "PartlyUsedHeads (aux_head.weight, aux_head.bias) got no gradient in the first training step" in error
    assert SETTING in error and "ddp_find_unused_parameters_true" not in result.stderr
    assert list(cwd.iterdir()) == []  # refused before the first optimizer step: no run folder


def test_a_parameter_dropped_after_the_first_step_is_one_line_and_the_run_is_kept(outcomes):
    result, cwd = outcomes["head-dropped-after-step-1"]
    error = one_error_line(result)
    assert "training reached step 2" in error and "(aux_head.weight, aux_head.bias)" in error, error
    assert "the previous training step" in error and SETTING in error
    assert (cwd / "logs" / "digits" / "version_0" / "config.yaml").is_file()


def test_find_unused_parameters_true_trains_the_same_model(outcomes):
    result, _ = outcomes["head-never-trained-find-unused"]
    assert result.returncode == 0, result.stderr[-3000:]


def test_check_reports_a_parameter_without_gradient_as_its_verdict(outcomes):
    result, cwd = outcomes["check-head-never-trained"]
    error = one_error_line(result)
    assert error.startswith("error: check failed: 2 parameter(s) of PartlyUsedHeads") and SETTING in error, error
    assert "FAILED 2 parameter(s) of PartlyUsedHeads" in result.stdout, result.stdout
    report = json.loads((cwd / "check.json").read_text())
    assert not report["ok"] and len(report["failures"]) == 1 and "aux_head.weight" in report["failures"][0]


def test_trainer_strategy_find_unused_names_the_parallel_setting(outcomes):
    result, cwd = outcomes["trainer-strategy-find-unused"]
    error = one_error_line(result)
    assert "trainer.strategy='ddp_find_unused_parameters_true'" in error and SETTING in error, error
    assert list(cwd.iterdir()) == []


def test_manual_optimization_with_accumulation_is_refused_before_training(outcomes):
    result, cwd = outcomes["manual-accumulation-fit"]
    error = one_error_line(result)
    assert "parallel.accumulation=2" in error and "ManualGAN sets `automatic_optimization = False`" in error, error
    assert "set parallel.accumulation: 1" in error and "accumulate_grad_batches" not in result.stderr
    assert "Starting with 2 processes" not in result.stdout + result.stderr  # before any process started
    assert list(cwd.iterdir()) == []


def test_plan_refuses_manual_optimization_with_a_derived_accumulation(outcomes):
    result, cwd = outcomes["manual-accumulation-plan"]
    error = one_error_line(result)
    assert "parallel.global_batch_size=128 (per_device_batch_size 32 x world size 2 x accumulation 2)" in error
    assert "set parallel.global_batch_size: 64" in error and "automatic_optimization = False" in error, error
    assert list(cwd.iterdir()) == []


def test_a_learning_rate_finder_on_two_processes_is_one_line_before_training(outcomes):
    result, cwd = outcomes["lr-finder-on-two-processes"]
    error = one_error_line(result)
    assert "trainer.callbacks has LearningRateFinder on 2 processes" in error and "--parallel.devices 1" in error
    assert list(cwd.iterdir()) == []
