"""Streams (IterableDataset) keep the template's promises: the same global batches at any world size, no sample
trained on twice, and a mid-epoch resume that is exact (a stateful stream) or says how it re-reads (a stateless one).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_resume import STEPS, callback

from project.parallel.stream import GlobalBatchStream

from helpers import CPU_DDP, FAST, read_plan, run_cli, run_dirs, two_at_a_time

# 1,707 training samples in global batches of 32: 53 steps an epoch, the tail of 11 dropped.
COMMON = ["fit", "--config", STEPS, "--config", FAST, "--model.init_args.net.init_args.dropout", "0"]
COMMON += ["--model.init_args.net.init_args.batch_norm", "false", "--parallel.global_batch_size", "32"]
COMMON += ["--trainer.limit_val_batches", "2", "--test_after_fit", "false", "--trainer.max_steps", "30"]
# SGD: float32's reordered sums under DDP stay ~1e-8 (AdamW turns the noise in tiny gradients into whole steps).
COMMON += ["--optimizer.class_path", "torch.optim.SGD", "--optimizer.init_args.lr", "0.05"]
COMMON += ["--optimizer.init_args.momentum", "0.9"]
STATELESS = ["--data.class_path", "user_code.StreamedDigits"]
STATEFUL = ["--data.class_path", "user_shapes.ShuffledStreamDigits"]


@pytest.mark.parametrize(("world", "accumulation"), [(1, 1), (2, 1), (4, 1), (2, 2), (4, 3)])
def test_each_rank_takes_its_slice_of_the_same_global_batches(world, accumulation):
    """Per-device batches of 3: the ranks' slices of each micro-step, in rank order, are the one-process stream."""
    stream, per_device = list(range(100)), 3
    shares = [list(GlobalBatchStream(stream, per_device, world, rank, accumulation)) for rank in range(world)]
    step = per_device * world * accumulation
    kept = 100 // step * step  # whole optimizer steps only
    micro = [shares[r][i : i + per_device] for i in range(0, len(shares[0]), per_device) for r in range(world)]
    assert [x for chunk in micro for x in chunk] == stream[:kept]
    assert sorted(x for share in shares for x in share) == stream[:kept]  # no sample twice


def test_a_resumed_stream_skips_the_global_batches_already_trained():
    stream = GlobalBatchStream(list(range(40)), 2, num_replicas=2, rank=1)
    stream.skip_batches = 3  # 3 global micro-batches of 4 samples
    assert list(stream) == [14, 15, 18, 19, 22, 23, 26, 27, 30, 31, 34, 35, 38, 39]
    assert list(stream)[:2] == [2, 3]  # the skip is used once: the next epoch starts at its beginning


def _weights(cwd: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dirs(cwd)[-1] / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def _assert_close(got: dict, want: dict) -> None:
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0.0, msg=key)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[str, Path]:
    """Uninterrupted 30-step runs: the stateless stream on 1 process, the stateful one on 2."""
    one, two = tmp_path_factory.mktemp("stream_one"), tmp_path_factory.mktemp("stream_two")
    results = two_at_a_time(
        lambda: run_cli([*COMMON, *STATELESS], one),
        lambda: run_cli([*COMMON, *STATEFUL, "--config", CPU_DDP], two),
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return {"one": one, "two": two}


@pytest.mark.distributed
def test_a_stream_trains_alike_on_one_and_two_processes(straight, tmp_path):
    """The stateless stream on 2 processes ends within 1e-5 of 1 process; plan.json says what holds."""
    result = run_cli([*COMMON, *STATELESS, "--config", CPU_DDP], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning: training batches depend on the world size" not in result.stderr
    _assert_close(_weights(tmp_path), _weights(straight["one"]))
    training = read_plan(run_dirs(tmp_path)[-1])["guarantees"]["training"]
    assert training["held"] is True and "stream" in training["detail"] and "16 per process x 2" in training["detail"]


@pytest.mark.distributed
def test_a_stateful_stream_resumes_exactly_on_another_world_size(straight, tmp_path):
    """Killed at step 15 on 2 processes (last.ckpt at step 10, mid-epoch), resumed on 1: equal to the straight run."""
    killed = run_cli(
        [*COMMON, *STATEFUL, "--config", CPU_DDP, callback("faults.KillAtStep", step=15, rank=0)], tmp_path
    )
    assert killed.returncode != 0
    resumed = run_cli([*COMMON, *STATEFUL, "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step 10" in resumed.stderr and "warning: resuming epoch" not in resumed.stderr
    _assert_close(_weights(tmp_path), _weights(straight["two"]))


def test_a_stateless_stream_resumes_by_rereading_and_says_so(straight, tmp_path):
    """Killed at step 15 (last.ckpt at step 10): the resume re-reads 320 samples, says so, and ends equal."""
    killed = run_cli([*COMMON, *STATELESS, callback("faults.KillAtStep", step=15, rank=0)], tmp_path)
    assert killed.returncode != 0
    resumed = run_cli([*COMMON, *STATELESS, "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = [line for line in resumed.stderr.splitlines() if line.startswith("warning: resuming epoch 0")]
    assert len(lines) == 1 and "first 320 samples are read again" in lines[0], resumed.stderr[-3000:]
    _assert_close(_weights(tmp_path), _weights(straight["one"]))
