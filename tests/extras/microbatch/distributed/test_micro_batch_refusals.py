"""What ``micro_batch: auto`` refuses in a real run: one ``error:`` line naming the setting, exit code 2."""

from __future__ import annotations

import re

from helpers import CPU_DDP, DIGITS, FAST, run_cli

SHORT = ["--trainer.limit_train_batches", "2", "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "1"]
FIT = ["fit", "--config", DIGITS, "--config", FAST, *SHORT, "--test_after_fit", "false"]


def test_manual_optimization_with_micro_batch_auto_is_refused_before_training(tmp_path):
    gan = ["--config", CPU_DDP, "--model", "user_code.ManualGAN"]
    result = run_cli([*FIT, *gan, "--parallel.micro_batch", "auto"], tmp_path, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output, output[-3000:]
    errors = [line for line in result.stderr.splitlines() if re.match(r"(\[rank \d+\] )?error: ", line)]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr[-3000:]
    assert "parallel.micro_batch='auto'" in errors[0] and "ManualGAN" in errors[0], errors[0]
    assert "set parallel.micro_batch to a number" in errors[0], errors[0]
    assert list(tmp_path.iterdir()) == []
