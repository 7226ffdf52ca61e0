"""The main job as the README runs it: configs/digits.yaml reaches its accuracy, and testing and predicting from
its best checkpoint reproduce the logged test accuracy (the full 20-epoch fit: the slow lane)."""

from __future__ import annotations

import pytest
import torch

from project.data.arrays import load_digits_tensors, seeded_split, split_sizes

from helpers import DIGITS, has_layer, read_plan, read_scalars, run_cli, run_dirs


def test_main_job_reaches_accuracy_and_test_from_checkpoint_reproduces_it(tmp_path):
    fit = run_cli(["fit", "--config", DIGITS], tmp_path)
    assert fit.returncode == 0, fit.stderr
    (run,) = run_dirs(tmp_path)
    assert f"Run directory: logs/digits/{run.name}" in fit.stdout
    scalars = read_scalars(run)
    for tag in ("train/loss", "val/loss", "val/acc", "test/acc"):
        assert tag in scalars, sorted(scalars)
    logged = scalars["test/acc"][-1][1]
    assert logged >= 0.95
    assert (run / "config.yaml").is_file() and read_plan(run)["world_size"] == 1
    assert (run / "checkpoints" / "last.ckpt").is_file()
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    # Checkpoints load under torch's default weights_only=True: no pickled modules in hyperparameters.
    torch.load(best, weights_only=True)

    again = []
    for _ in range(2):
        test = run_cli(["test", "--config", DIGITS, "--ckpt_path", str(best)], tmp_path)
        assert test.returncode == 0, test.stderr
        again.append(read_scalars(run_dirs(tmp_path)[-1])["test/acc"][-1][1])
    assert again[0] == again[1]
    assert again[0] == pytest.approx(logged, abs=1e-6)

    predict = run_cli(["predict", "--config", DIGITS, "--ckpt_path", str(best)], tmp_path)
    assert predict.returncode == 0, predict.stderr
    if not has_layer("predictions"):
        return
    rows = (run_dirs(tmp_path)[-1] / "predictions.csv").read_text().splitlines()
    assert rows[0] == "index,prediction" and len(rows) == 1 + 270
    labels = digits_test_labels()
    correct = sum(int(row.split(",")[1]) == label for row, label in zip(rows[1:], labels))
    assert correct / len(labels) == pytest.approx(logged, abs=1e-6)


def digits_test_labels() -> list[int]:
    x, y = load_digits_tensors()
    return seeded_split(x, y, split_sizes(len(x), 0.15, 0.15), seed=0)[2].tensors[1].tolist()
