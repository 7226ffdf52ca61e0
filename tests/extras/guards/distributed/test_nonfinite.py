"""A non-finite training loss: stop naming the step with the last good checkpoint kept, or skip the step.

Real 2-process runs over gloo where only rank 1's loss is nan (tests/faults.py ``NonFiniteLossAt``): the
ranks must agree, or rank 0 would apply the nan gradients that the all-reduce brought it from rank 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers import CPU_DDP, DIGITS, FAST, read_scalars, run_cli, run_dirs

pytestmark = pytest.mark.distributed

FIT = ["fit", "--config", DIGITS, "--config", CPU_DDP, "--config", FAST]
NAN_ON_RANK_1 = ["--model.class_path", "faults.NonFiniteLossAt", "--model.init_args.nan_rank", "1"]


def all_finite(state: dict[str, torch.Tensor]) -> bool:
    """Whether every floating-point tensor of a state dict is finite."""
    return all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    # Step 13 is mid-epoch 1 (9 steps per epoch), after the epoch-0 checkpoint (saved after step 10, the next epoch's
    # first). By default (the nonfinite section) the ranks compare their losses every 10 steps and before every save:
    # epoch 1 (the last, of 2) ends the fit at step 18, whose save is checked first.
    result = run_cli([*FIT, *NAN_ON_RANK_1, "--model.init_args.nan_steps", "[13]"], tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (
        "error: the training loss is not finite at step 13 (epoch 1) (rank 1: nan); found at the end of training "
        "(check_every_n_steps=10); the updates of steps 13 to 17 were applied, never saved"
    ) in result.stderr
    (run,) = run_dirs(tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    assert f"the last good checkpoint is {last.relative_to(tmp_path)}" in result.stderr
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["global_step"] < 13
    assert all_finite(checkpoint["state_dict"])


def test_nonfinite_loss_can_skip_the_step_on_every_rank(tmp_path):
    # `action: skip` set the way a user does: in a config file (the guards layer's `nonfinite` section).
    config = tmp_path / "skip.yaml"
    config.write_text("nonfinite:\n  action: skip\n  check_every_n_steps: 1\n")
    args = [*FIT, "--config", str(config), *NAN_ON_RANK_1, "--model.init_args.nan_steps", "[3, 13]"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for step, epoch in ((3, 0), (13, 1)):
        assert f"skipped the update of step {step} (epoch {epoch})" in result.stderr
    (run,) = run_dirs(tmp_path)
    scalars = read_scalars(run)
    assert scalars["train/skipped_steps"][-1][1] == 2
    assert all(math.isfinite(value) for step, value in scalars["train/loss"] if step not in (3, 13))
    assert all_finite(torch.load(run / "export" / "model.pt", weights_only=True))
    assert scalars["test/acc"][-1][1] >= 0.8


def test_checking_before_every_update_stops_before_the_bad_one(tmp_path):
    # check_every_n_steps: 1 reads the verdict (the all-reduced gradients) before every update.
    args = [*FIT, "--nonfinite.check_every_n_steps", "1", *NAN_ON_RANK_1, "--model.init_args.nan_steps", "[13]"]
    result = run_cli(args, tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (
        "error: the training loss is not finite at step 13 (epoch 1) (rank 1: nan); stopped before applying that "
        "update, the last good checkpoint is"
    ) in result.stderr
    (run,) = run_dirs(tmp_path)
    for checkpoint in (run / "checkpoints").glob("*.ckpt"):
        saved = torch.load(checkpoint, weights_only=True)
        assert saved["global_step"] < 13 and all_finite(saved["state_dict"]), checkpoint.name


def test_skip_needs_a_check_before_every_update():
    from project.extras.guards.nonfinite import NonFiniteLossCallback

    with pytest.raises(ValueError, match="action: skip needs check_every_n_steps: 1"):
        NonFiniteLossCallback(action="skip", check_every_n_steps=10)
