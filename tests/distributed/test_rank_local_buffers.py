"""``parallel.ddp.broadcast_buffers: false`` keeps each rank's own buffers: validation does not leave rank 0's there."""

from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path

import pytest
import torch

from helpers import CONFIGS, CPU_DDP, FAST, run_cli, run_dirs, two_at_a_time

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
    found = json.loads(record.read_text())
    assert {rank: mine["changed"] for rank, mine in found.items()} == {"0": 0, "1": 0}
    assert found["0"]["mean"] != found["1"]["mean"]  # each rank's own statistic


def _fit(cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    config = cwd / "own.yaml"  # own_module.yaml whose last.ckpt is also saved every 5 steps: a known resume point
    config.write_text(Path(OWN).read_text().replace("every_s: 60\n", "every_s: 60\n        every_n_steps: 5\n"))
    model = ["--model", "rank_local.RunningNormaliser", "--model.init_args.record", str(cwd / "record.json")]
    model += ["--data", "project.data.digits.DigitsDataModule", "--trainer.max_epochs", "2"]
    args = ["fit", "--config", str(config), "--config", CPU_DDP, "--config", FAST, *model, *extra]
    return run_cli([*args, "--trainer.limit_val_batches", "1", "--test_after_fit", "false"], cwd)


def test_a_resume_continues_each_ranks_own_statistic_exactly(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    straight.mkdir(), killed.mkdir()
    kill = json.dumps({"class_path": "faults.KillAtStep", "init_args": {"step": 12, "rank": 1}})
    done, stopped = two_at_a_time(partial(_fit, straight), partial(_fit, killed, f"--trainer.callbacks+={kill}"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert stopped.returncode != 0
    resumed = _fit(killed, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want, got = (json.loads((cwd / "record.json").read_text()) for cwd in (straight, killed))
    assert got["1"]["mean"] == want["1"]["mean"] and got["0"]["mean"] == want["0"]["mean"]
    (a,), (b,) = run_dirs(straight, "own"), run_dirs(killed, "own")
    ours = torch.load(b / "checkpoints" / "last.ckpt", weights_only=True)
    theirs = torch.load(a / "checkpoints" / "last.ckpt", weights_only=True)
    for key, value in theirs["state_dict"].items():
        assert torch.equal(ours["state_dict"][key], value), key
