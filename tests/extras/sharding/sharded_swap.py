"""Sharded checkpoints written and resumed in one process, for the tests of the swap by renames (tests/unit and
tests/distributed: test_sharded_swap*.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from jsonargparse import Namespace
from torch import nn

from project.checkpoints.resume import choose_checkpoint, remove_partial_writes
from project.extras.sharding.checkpoints import is_sharded_checkpoint
from project.extras.sharding.checkpoints import save as sharded_save
from project.extras.sharding.checkpoints.merge import load_full_checkpoint


def weights_of(step: int) -> dict[str, torch.Tensor]:
    """The weights the checkpoint of global step ``step`` holds (each step its own)."""
    torch.manual_seed(step)
    return nn.Linear(3, 2).state_dict()


def write(path: Path, step: int) -> None:
    """A sharded checkpoint of global step ``step`` at ``path``, written by the template's writer in one process."""
    weights = weights_of(step)
    checkpoint = {"state_dict": weights, "optimizer_states": [], "epoch": 0, "global_step": step, "loops": {}}
    path.parent.mkdir(parents=True, exist_ok=True)
    sharded_save.save_sharded(checkpoint, path, f"t{step}", True, lambda: None)


def trainer_section(root: Path) -> Namespace:
    """The trainer section of a config whose logger writes runs under ``root``/logs/toy."""
    return Namespace(logger=Namespace(init_args=Namespace(save_dir=str(root / "logs"), name="toy")))


def resume_and_check(root: Path, step: int) -> None:
    """``--resume auto``'s choice, then the locked run's recovery: ``last.ckpt`` holds ``step``, nothing hidden."""
    checkpoints = root / "logs" / "toy" / "version_0" / "checkpoints"
    chosen = choose_checkpoint("fit", None, "auto", trainer_section(root))
    assert chosen is not None and chosen.continues
    assert chosen.path == str(checkpoints / "last.ckpt") and chosen.describe() == f"epoch 0, step {step}"
    remove_partial_writes(chosen)
    assert [p.name for p in checkpoints.iterdir()] == ["last.ckpt"], "a hidden leftover stayed"
    assert is_sharded_checkpoint(checkpoints / "last.ckpt")
    loaded = load_full_checkpoint(checkpoints / "last.ckpt")
    assert loaded["global_step"] == step
    for key, value in weights_of(step).items():
        torch.testing.assert_close(loaded["state_dict"][key], value)
