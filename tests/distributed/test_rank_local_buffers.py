"""``parallel.ddp.broadcast_buffers: false`` keeps each rank's own buffers: validation does not leave rank 0's there."""

from __future__ import annotations

import json

import pytest

from helpers import CONFIGS, CPU_DDP, FAST, run_cli

OWN = str(CONFIGS / "own_module.yaml")

pytestmark = pytest.mark.distributed


def test_validation_puts_each_ranks_own_buffer_back(tmp_path):
    record = tmp_path / "changed.json"
    model = ["--model", "rank_local.RunningNormaliser", "--model.init_args.record", str(record)]
    model += ["--data", "project.data.digits.DigitsDataModule"]
    args = ["fit", "--config", OWN, "--config", CPU_DDP, "--config", FAST, *model, "--trainer.max_epochs", "3"]
    result = run_cli([*args, "--trainer.limit_val_batches", "1", "--test_after_fit", "false"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # Two validations between the three epochs: rank 1 found rank 0's statistic there after each before the fix.
    assert json.loads(record.read_text()) == {"0": 0, "1": 0}
