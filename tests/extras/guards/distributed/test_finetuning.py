"""Lightning's BackboneFinetuning on a plain module: the backbone unfrozen at epoch 1 trains the same on 1 and 2
processes (DDP rebuilt around the new trainable set), and a run killed after the unfreezing resumes exactly (the
trainable set comes back from the checkpoint, where Lightning's own restore would freeze the backbone again).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch
from user_guard_shapes import own_every_10_steps

from helpers import CPU_DDP, FAST, assert_clean_error, run_cli, run_dirs, two_at_a_time

FINETUNING = {
    "class_path": "lightning.pytorch.callbacks.BackboneFinetuning",
    "init_args": {"unfreeze_backbone_at_epoch": 1},
}
ARGS = ["--model", "guard_shapes.BackboneClassifier", "--data", "user_code.PlainDigits", "--data.bs", "16"]
ARGS += ["--config", FAST, "--trainer.max_epochs", "3", "--trainer.limit_val_batches", "2", "--test_after_fit", "false"]
ARGS += ["--parallel.global_batch_size", "32"]
FINETUNED = [*ARGS, "--trainer.callbacks+=" + json.dumps(FINETUNING)]


def fit(cwd: Path, *extra: str, args: list[str] = FINETUNED) -> Path:
    cwd.mkdir(exist_ok=True)
    result = run_cli(["fit", "--config", own_every_10_steps(), *args, *extra], cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dirs(cwd, name="own")[-1]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same global batch (32) on 1 and 2 processes, three epochs, the backbone unfrozen at the second."""
    root = tmp_path_factory.mktemp("finetuning")
    one, two = two_at_a_time(partial(fit, root / "one"), partial(fit, root / "two", "--config", CPU_DDP))
    return {"one": one, "two": two}


def test_a_module_unfreezing_itself_mid_epoch_on_two_processes_matches_one(tmp_path):
    """Unfrozen in its own on_train_batch_start (after the template's hook): that step's new gradients are
    averaged by the template before the optimizer step, and DDP is rebuilt for the next."""
    own = ["--model", "guard_shapes.SelfUnfreezing", "--model.unfreeze_step", "30", "--trainer.max_epochs", "1"]
    one, two = two_at_a_time(
        partial(fit, tmp_path / "one", *own, args=ARGS),
        partial(fit, tmp_path / "two", *own, "--config", CPU_DDP, args=ARGS),
    )
    state = torch.load(two / "checkpoints" / "last.ckpt", weights_only=True)["optimizer_states"][0]["state"]
    assert len(state) == 4  # momentum for the head's 2 parameters and, once it trained, the backbone's 2
    for key, value in weights(one).items():
        torch.testing.assert_close(weights(two)[key], value, atol=1e-5, rtol=0.0, msg=key)


def test_backbone_finetuning_on_two_processes_matches_one(runs):
    one, two = weights(runs["one"]), weights(runs["two"])
    groups = torch.load(runs["two"] / "checkpoints" / "last.ckpt", weights_only=True)["optimizer_states"][0]
    assert len(groups["param_groups"]) == 2  # the head's, and the backbone's added at the unfreezing
    for key, value in one.items():
        torch.testing.assert_close(two[key], value, atol=1e-5, rtol=0.0, msg=key)


def test_a_kill_after_the_unfreezing_resumes_exactly(tmp_path, runs):
    marker = str(tmp_path / "killed-once")  # the resumed run reads the same config, callbacks included
    kill = {"class_path": "resume_faults.KillOnceAtStep", "init_args": {"step": 115, "marker": marker, "rank": 0}}
    killed = run_cli(
        ["fit", "--config", own_every_10_steps(), *FINETUNED, "--trainer.callbacks+=" + json.dumps(kill)], tmp_path
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    (run,) = run_dirs(tmp_path, name="own")
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 110 and saved["epoch"] == 2  # saved with the backbone training
    resumed = run_cli(["fit", "--config", str(run / "config.yaml"), "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got, want = weights(run), weights(runs["one"])
    assert not torch.equal(got["backbone.0.weight"], saved["state_dict"]["backbone.0.weight"])  # it trained on
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def test_parameter_groups_a_resume_does_not_rebuild_are_one_line(tmp_path):
    own = json.dumps({"class_path": "guard_shapes.UnfreezeAddingGroup", "init_args": {"epoch": 1}})
    marker = str(tmp_path / "killed-once")
    kill = {"class_path": "resume_faults.KillOnceAtStep", "init_args": {"step": 65, "marker": marker, "rank": 0}}
    args = ["fit", "--config", own_every_10_steps(), *ARGS, "--trainer.callbacks+=" + own]
    killed = run_cli([*args, "--trainer.callbacks+=" + json.dumps(kill)], tmp_path)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (run,) = run_dirs(tmp_path, name="own")
    resumed = run_cli(["fit", "--config", str(run / "config.yaml"), "--resume", "auto"], tmp_path)
    assert_clean_error(
        resumed, "the optimizers' parameter groups differ from the checkpoint's", "optimizer 0: [2: head"
    )
    assert resumed.returncode == 2
