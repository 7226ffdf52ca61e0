"""Weights trained by a raw DataParallel script come in through --model.init_args.weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from project.data.arrays import load_digits_tensors, seeded_split, split_sizes
from project.models.digits_net import DigitsNet

from helpers import DIGITS, FAST, assert_clean_error, read_scalars, run_cli, run_dirs


def raw_dataparallel_training() -> tuple[dict[str, torch.Tensor], float]:
    """A few epochs of the seed's raw loop under nn.DataParallel; returns its state dict and test accuracy."""
    torch.manual_seed(0)
    x, y = load_digits_tensors()
    train, _, test = seeded_split(x, y, split_sizes(len(x), 0.15, 0.15), seed=0)
    model = nn.DataParallel(DigitsNet())  # the same network digits.yaml builds
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(3):
        for i in range(0, len(train), 64):
            xb, yb = train[i : i + 64]
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean().item()
    return model.state_dict(), accuracy


def test_dataparallel_weights_are_evaluated_and_fine_tuned(tmp_path):
    state, accuracy = raw_dataparallel_training()
    assert all(key.startswith("module.") for key in state)
    torch.save(state, tmp_path / "old_dp_model.pt")

    test = run_cli(["test", "--config", DIGITS, "--model.init_args.weights", "old_dp_model.pt"], tmp_path)
    assert test.returncode == 0, test.stderr[-3000:]
    assert read_scalars(run_dirs(tmp_path)[-1])["test/acc"][-1][1] == pytest.approx(accuracy, abs=1e-6)

    args = ["fit", "--config", DIGITS, "--config", FAST, "--trainer.max_epochs", "1", "--test_after_fit", "false"]
    fit = run_cli([*args, "--model.init_args.weights", "old_dp_model.pt"], tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]


def test_weights_of_another_network_list_missing_and_unexpected_keys(tmp_path):
    torch.save(nn.DataParallel(DigitsNet(batch_norm=False, hidden=32)).state_dict(), tmp_path / "other.pt")
    result = run_cli(["test", "--config", DIGITS, "--model.init_args.weights", "other.pt"], tmp_path)
    assert_clean_error(result, "other.pt", "missing keys", "unexpected keys", "layers.1.running_mean")
    assert not (tmp_path / "logs").exists()
