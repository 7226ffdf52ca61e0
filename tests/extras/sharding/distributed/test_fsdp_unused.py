"""scenario fsdp with parameters that never get a gradient: a head that ``forward`` does not use.

The optimizer holds no state for such a parameter, so neither does the checkpoint (a sharded folder, or the file
``consolidate`` makes of it). Loading it must leave the parameter without state too, as in the run that wrote it,
whether the optimizer is fresh (a resume: torch makes state up for every parameter) or has stepped; and such a
checkpoint is not "incomplete or corrupt", words kept for damaged files.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

from project.errors import UserError
from project.extras.sharding import checkpoints as sharded
from project.extras.sharding.checkpoints import load as sharded_load
from project.extras.sharding.checkpoints import merge as sharded_merge
from project.extras.sharding.checkpoints import save as sharded_save
from project.extras.sharding.consolidate import consolidate

from helpers import CONFIGS, DIGITS, FAST, read_scalars, run_cli, run_dirs, two_at_a_time

CPU_FSDP = str(CONFIGS / "sharding" / "cpu_fsdp.yaml")
UNUSED_HEAD = ["--model.class_path", "user_code.UnusedHeadClassifier", "--trainer.limit_train_batches", "4"]


class WithUnusedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(3, 2)
        self.unused = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def trained(steps: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    module = WithUnusedHead()
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    for _ in range(steps):
        module(torch.randn(8, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return module, optimizer


def save(module: nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    checkpoint = {
        "state_dict": module.state_dict(),
        "optimizer_states": [get_optimizer_state_dict(module, optimizer)],
        "epoch": 0,
        "global_step": 2,
        "loops": {},
        "callbacks": {},
    }
    sharded_save.save_sharded(checkpoint, path, "t", True, lambda: None)


def test_a_parameter_without_optimizer_state_loads_into_fresh_and_stepped_optimizers(tmp_path):
    module, optimizer = trained(steps=2)
    folder = tmp_path / "last.ckpt"
    save(module, optimizer, folder)
    keys = sharded.read_metadata(folder).state_dict_metadata.keys()
    assert "state_dict.unused.weight" in keys and not any(".state.unused." in key for key in keys)
    # Fresh (a resume: torch makes state up for every parameter) and stepped (the test after a fit).
    for fresh, its_optimizer in trained(steps=0), trained(steps=1):
        sharded_load.load_sharded_into(folder, fresh, [its_optimizer])
        assert all(torch.equal(fresh.state_dict()[k], v) for k, v in module.state_dict().items())
        assert its_optimizer.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys() == {0, 1}
        for want, got in zip(optimizer.state.values(), its_optimizer.state.values()):
            torch.testing.assert_close(got["exp_avg"], want["exp_avg"], rtol=0, atol=0)
    # Another optimizer's state does not fit; a damaged shard is "incomplete or corrupt" (one line each).
    other = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(UserError, match=r"does not fit this model or its optimizer \(Missing key .*momentum_buffer\)"):
        sharded_load.load_sharded_into(folder, module, [other])
    (folder / "__0_0.distcp").write_bytes(b"damaged")
    with pytest.raises(UserError, match=r"last.ckpt' is incomplete or corrupt and cannot be loaded \("):
        consolidate([str(folder)])


def fit(cwd: Path, epochs: int, *extra: str) -> subprocess.CompletedProcess[str]:
    """The digits job with an unused head under 2-process fsdp: 4 steps an epoch."""
    args = ["fit", "--config", DIGITS, "--config", CPU_FSDP, "--config", FAST, *UNUSED_HEAD]
    return run_cli([*args, "--trainer.max_epochs", str(epochs), *extra], cwd)


def said(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stdout + result.stderr)[-4000:]


def assert_same_training_state(got: dict, want: dict) -> None:
    """Weights and optimizer state within 1e-5 (as the other resume tests), and no optimizer state for the head."""
    assert got["global_step"] == want["global_step"] == 12
    for key, value in want["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][key], value, rtol=1e-5, atol=1e-5, msg=key)
    got_state, want_state = got["optimizer_states"][0]["state"], want["optimizer_states"][0]["state"]
    parameters = want["optimizer_states"][0]["param_groups"][0]["params"]
    assert got_state.keys() == want_state.keys() and len(want_state) == len(parameters) - 2  # the head's 2
    for index, fields in want_state.items():
        for field, value in fields.items():
            torch.testing.assert_close(got_state[index][field], value, rtol=1e-5, atol=1e-5, msg=f"{index}.{field}")


@pytest.mark.distributed
def test_an_unused_head_under_fsdp_tests_resumes_exactly_and_consolidates(tmp_path):
    resumed, from_file, straight = tmp_path / "resumed", tmp_path / "from_file", tmp_path / "straight"
    for folder in resumed, from_file, straight:
        folder.mkdir()
    first, whole = two_at_a_time(lambda: fit(resumed, 2), lambda: fit(straight, 3, "--test_after_fit", "false"))
    assert first.returncode == 0 and whole.returncode == 0, said(first) + said(whole)
    (run,) = run_dirs(resumed)
    assert read_scalars(run)["test/acc"][-1][1] > 0.5  # the test after fit, of the sharded best checkpoint
    last = run / "checkpoints" / "last.ckpt"
    assert sharded.is_sharded_checkpoint(last)
    consolidated = consolidate([str(last), "--out", str(tmp_path / "consolidated.ckpt")])
    merged = torch.load(consolidated, weights_only=True)
    assert merged["state_dict"]["aux_head.weight"].shape == (10, 64) and merged["global_step"] == 8
    # 2 epochs, then a third resumed from the sharded folder, or from its consolidated file: as 3 straight.
    again, from_merged = two_at_a_time(
        lambda: fit(resumed, 3, "--resume", "auto", "--test_after_fit", "false"),
        lambda: fit(from_file, 3, "--ckpt_path", str(consolidated), "--test_after_fit", "false"),
    )
    assert again.returncode == 0 and "(epoch 2, step 8)" in again.stderr, said(again)  # the end of fit, saved
    assert from_merged.returncode == 0, said(from_merged)
    (other,) = run_dirs(straight)
    want = sharded_merge.load_full_checkpoint(other / "checkpoints" / "last.ckpt")
    assert_same_training_state(sharded_merge.load_full_checkpoint(last), want)
    (run_from_file,) = run_dirs(from_file)
    assert_same_training_state(sharded_merge.load_full_checkpoint(run_from_file / "checkpoints" / "last.ckpt"), want)
