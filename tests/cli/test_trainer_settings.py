"""Lightning's own trainer settings beside the ``parallel`` section: taken when they mean one of its settings."""

from __future__ import annotations

import json

import torch
import yaml

from helpers import DIGITS, FAST, run_cli, run_dirs

SHORT = ["--trainer.max_steps", "6", "--trainer.limit_val_batches", "0", "--test_after_fit", "false"]


def _trained(tmp_path, name, *options):
    cwd = tmp_path / name
    cwd.mkdir()
    result = run_cli(["fit", "--config", DIGITS, "--config", FAST, *SHORT, *options], cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = run_dirs(cwd)
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    return result, run, state


def test_trainer_accumulate_grad_batches_trains_as_parallel_accumulation(tmp_path):
    taken, run, got = _trained(tmp_path, "trainer", "--trainer.accumulate_grad_batches", "2")
    _, _, want = _trained(tmp_path, "parallel", "--parallel.accumulation", "2")
    assert "note: trainer.accumulate_grad_batches=2 is taken as parallel.accumulation: 2" in taken.stderr
    assert got["global_step"] == want["global_step"] == 6
    for key, value in want["state_dict"].items():
        assert torch.equal(got["state_dict"][key], value), key
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["parallel"]["accumulation"] == 2 and saved["trainer"]["accumulate_grad_batches"] == 1


def test_a_gradient_accumulation_scheduler_is_in_the_plan_with_each_epochs_global_batch(tmp_path):
    schedule = '{"class_path": "lightning.pytorch.callbacks.GradientAccumulationScheduler", "init_args": '
    schedule += '{"scheduling": {"0": 1, "1": 2}}}'
    cwd = tmp_path / "scheduled"
    cwd.mkdir()
    args = ["fit", "--config", DIGITS, "--config", FAST, "--trainer.callbacks+=" + schedule, "--trainer.max_epochs"]
    result = run_cli([*args, "2", "--trainer.limit_val_batches", "1", "--test_after_fit", "false"], cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = run_dirs(cwd)
    plan = json.loads((run / "plan.json").read_text())
    batch = plan["global_batch_size"]
    assert plan["accumulation_schedule"] == {
        "0": {"accumulation": 1, "global_batch_size": batch},
        "1": {"accumulation": 2, "global_batch_size": 2 * batch},
    }
    assert f"GradientAccumulationScheduler: global batches from epoch 0: {batch}, epoch 1: {2 * batch}" in plan["notes"]
