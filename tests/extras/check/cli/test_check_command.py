"""The check command's row (a layer's row of the command table): it runs fit and leaves only its report."""

from __future__ import annotations

from project.commands import COMMANDS

from helpers import DIGITS, FAST, run_cli

SMALL = ["--config", DIGITS, "--config", FAST, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2"]


def test_check_runs_fit_writes_only_its_report_and_takes_no_checkpoint(tmp_path):
    row = COMMANDS["check"]
    assert row.self_test and row.steps_optimizer and not row.takes_checkpoint
    result = run_cli(["check", *SMALL, "--steps", "2"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["check.json"]
    refused = run_cli(["check", *SMALL, "--ckpt_path", "last"], tmp_path)
    assert refused.returncode != 0 and "--ckpt_path" in refused.stderr
