"""Your own batch_sampler (length bucketing over variable-length sequences, a padding collate): each of its batches is
a global batch, split across the processes, so 1 and 2 processes train alike; a batch that cannot be split equally
is refused in one line naming the sampler. Both forms: a plain Sampler yielding index lists, a BatchSampler subclass;
and an index sampler (DataLoader(sampler=...)), whose order is cut into global batches.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch
from user_guard_shapes import own_every_10_steps

from helpers import CONFIGS, CPU_DDP, FAST, assert_clean_error, read_plan, run_cli, run_dirs, two_at_a_time

OWN = str(CONFIGS / "own_module.yaml")
ARGS = ["fit", "--config", OWN, "--config", FAST, "--model", "user_guard_shapes.SequenceClassifier"]
ARGS += ["--data", "user_guard_shapes.SequenceData", "--trainer.max_epochs", "2", "--test_after_fit", "false"]
FORMS = ("sampler", "batch_sampler", "order")
# An index sampler's order is cut into global batches of the plan's size; a batch sampler's batches are global.
GLOBAL = {"order": ["--parallel.global_batch_size", "16"]}


def fit(cwd: Path, form: str, *extra: str):
    cwd.mkdir(exist_ok=True)
    return run_cli([*ARGS, "--data.form", form, *extra], cwd)


def last_weights(cwd: Path) -> dict[str, torch.Tensor]:
    (run,) = run_dirs(cwd, name="own")
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.fixture(scope="module", params=FORMS)
def runs(request, tmp_path_factory) -> tuple[str, dict[str, Path]]:
    root = tmp_path_factory.mktemp(request.param)
    extra = GLOBAL.get(request.param, [])
    one, two = two_at_a_time(
        partial(fit, root / "one", request.param, *extra),
        partial(fit, root / "two", request.param, "--config", CPU_DDP, *extra),
    )
    for result in (one, two):
        assert result.returncode == 0, result.stderr[-3000:]
    return request.param, {"one": root / "one", "two": root / "two"}


def test_an_own_batch_sampler_trains_the_same_on_one_and_two_processes(runs):
    form, cwd = runs
    one, two = last_weights(cwd["one"]), last_weights(cwd["two"])
    for key, value in one.items():
        torch.testing.assert_close(two[key], value, atol=1e-5, rtol=0.0, msg=key)
    (run,) = run_dirs(cwd["two"], name="own")
    training = read_plan(run)["guarantees"]["training"]
    name = {"sampler": "batch_sampler BucketBatches", "batch_sampler": "batch_sampler BucketBatchSampler"}
    name["order"] = "sampler LongestFirstShuffled (its order cut into global batches of 16)"
    assert training["held"] and f"own {name[form]}" in training["detail"], training


def test_a_batch_two_processes_cannot_share_equally_is_refused_in_one_line(tmp_path):
    result = fit(tmp_path, "sampler", "--data.batch_size", "15", "--config", CPU_DDP)
    assert_clean_error(result, "batch_sampler BucketBatches yields a batch of 15 samples", "multiple of 2")
    assert run_dirs(tmp_path, name="own") == []  # refused before the first step: nothing left behind


def test_a_batch_sampler_beside_a_global_batch_size_is_refused_in_one_line(tmp_path):
    result = fit(tmp_path, "batch_sampler", "--parallel.global_batch_size", "32")
    assert_clean_error(result, "own batch_sampler BucketBatchSampler, whose batches are the global batches")


def test_a_kill_mid_epoch_resumes_the_own_batches_exactly(tmp_path, runs):
    form, cwd = runs
    if form != "sampler":
        pytest.skip("one form is enough: the same skip of global batches serves all three")
    marker = str(tmp_path / "killed-once")
    kill = {"class_path": "resume_faults.KillOnceAtStep", "init_args": {"step": 35, "marker": marker, "rank": 0}}
    every_10 = [own_every_10_steps() if arg == OWN else arg for arg in ARGS]  # last.ckpt at step 30 too
    killed = run_cli([*every_10, "--data.form", form, "--trainer.callbacks+=" + json.dumps(kill)], tmp_path)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (run,) = run_dirs(tmp_path, name="own")
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 30  # mid-epoch 1
    resumed = run_cli(["fit", "--config", str(run / "config.yaml"), "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for key, value in last_weights(cwd["one"]).items():
        assert torch.equal(last_weights(tmp_path)[key], value), key
