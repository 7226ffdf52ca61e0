"""``parallel.fsdp.async_save``: sharded (fsdp) checkpoints copied in memory and written in the background.

Real 2-process fsdp runs over gloo of test_fsdp's configuration (one epoch of 43 steps, ``last.ckpt`` every 10):

- an async run (the default) and a sync one (``--parallel.fsdp.async_save false``) end at the same state;
- every rank SIGKILLed while the save of step 20 is written in the background, training already two steps
  further: step 10's checkpoint is still under the name, step 20's a hidden folder, and ``fit --resume auto``
  continues from step 10 to the uninterrupted run's weights;
- a background write that fails (rank 1's shards; rank 0's swap of the last save) stops the run with one line
  and exit code 1, at the next save or at the end of ``fit``, and the checkpoint it was to replace is intact;
- in this process, on a group of one: a removal queued behind a save waits for it, and is skipped if it failed.

The faults are callbacks of ``tests/extras/sharding/fsdp_faults.py``, added by class path (the runs are forked from
the suite's imported server).
"""

from __future__ import annotations

import errno
import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from test_fsdp import COMMON, CPU_FSDP, assert_close_weights, said

from project.extras.sharding import checkpoints as sharded
from project.extras.sharding.checkpoints import merge as sharded_merge
from project.extras.sharding.checkpoints import save as sharded_save
from project.extras.sharding.checkpoints.asynchronous import AsyncShardedWriter, ShardedWriteError

from helpers import every_10_steps, read_plan, run_cli, run_dirs, two_at_a_time

STEPS = 1398 // 32  # one epoch


# ------------------------------------------------------------------------------------------- the runs
def fit(cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """test_fsdp's run (2 fsdp processes, ``last.ckpt`` every 10 steps, one epoch), no test after it, in ``cwd``."""
    cwd.mkdir(parents=True, exist_ok=True)
    args = ["fit", "--config", every_10_steps(), "--config", CPU_FSDP, *COMMON, "--test_after_fit", "false", *extra]
    return run_cli(args, cwd)


def fault(class_path: str, **init_args: Any) -> str:
    return "--trainer.callbacks+=" + json.dumps({"class_path": f"fsdp_faults.{class_path}", "init_args": init_args})


def checkpoints(cwd: Path) -> Path:
    return cwd / "logs" / "digits" / "version_0" / "checkpoints"


def full(path: Path) -> dict[str, Any]:
    return sharded_merge.load_full_checkpoint(path)


def assert_same_state(got: dict[str, Any], want: dict[str, Any]) -> None:
    """The same step, weights and optimizer state, bit for bit."""
    assert got["global_step"] == want["global_step"]
    assert got["state_dict"].keys() == want["state_dict"].keys()
    for key, value in want["state_dict"].items():
        assert torch.equal(got["state_dict"][key], value), key
    for mine, theirs in zip(got["optimizer_states"], want["optimizer_states"], strict=True):
        assert mine["state"].keys() == theirs["state"].keys()
        for index, state in theirs["state"].items():
            for name, value in state.items():
                assert torch.equal(torch.as_tensor(mine["state"][index][name]), torch.as_tensor(value)), (index, name)


def test_async_and_sync_saves_end_at_the_same_state_and_a_kill_while_writing_resumes_exactly(tmp_path):
    runs = {name: tmp_path / name for name in ("async", "sync", "killed")}
    done = two_at_a_time(
        lambda: fit(runs["async"]),
        lambda: fit(runs["sync"], "--parallel.fsdp.async_save", "false"),
        lambda: fit(runs["killed"], fault("KillWhileWriting", step=20)),
    )
    for result in done[:2]:
        assert result.returncode == 0, said(result)
    (run,) = run_dirs(runs["async"])
    assert read_plan(run)["strategy"]["fsdp"]["async_save"] is True
    (run,) = run_dirs(runs["sync"])
    assert read_plan(run)["strategy"]["fsdp"]["async_save"] is False
    want = full(checkpoints(runs["async"]) / "last.ckpt")
    assert want["global_step"] == STEPS
    assert_same_state(full(checkpoints(runs["sync"]) / "last.ckpt"), want)
    for cwd in (runs["async"], runs["sync"]):
        assert not list(checkpoints(cwd).glob(".*")), "a hidden folder left behind"

    # Killed while step 20 was written in the background, the training further on.
    killed = done[2]
    assert killed.returncode == -signal.SIGKILL, said(killed)
    at = re.search(r"fault: killing every rank at step (\d+), step 20 unswapped", killed.stderr)
    assert at is not None and int(at.group(1)) >= 22, said(killed)
    folder = checkpoints(runs["killed"])
    assert sharded.read_summary(folder / "last.ckpt")["global_step"] == 10
    (partial,) = folder.glob(".last.ckpt.*.tmp")
    assert (partial / sharded.LIGHTNING_META).is_file()  # complete, but never under the name
    resumed = fit(runs["killed"], "--resume", "auto")
    assert resumed.returncode == 0, said(resumed)
    assert "Resuming from" in resumed.stderr and "(epoch 0, step 10)" in resumed.stderr, said(resumed)
    assert not list(folder.glob(".*"))
    assert_close_weights(full(folder / "last.ckpt")["state_dict"], want["state_dict"])


def test_a_failed_background_write_stops_the_run_in_one_line(tmp_path):
    shards, finishing = two_at_a_time(
        # Rank 1's shards of step 20: every rank learns it from DCP; raised at the save of step 30.
        lambda: fit(tmp_path / "shards", fault("FailShards", step=20)),
        # Rank 0's swap of the last save (step 43, after the best checkpoint's): raised at the end of fit.
        lambda: fit(tmp_path / "finishing", fault("FailFinishing", step=STEPS)),
    )
    for result, cause in (
        (shards, "rank 1: OSError: [Errno 28] No space left on device"),
        (finishing, "OSError: [Errno 28] No space left on device"),
    ):
        assert result.returncode == 1, said(result)
        output = result.stdout + result.stderr
        assert "Traceback" not in output, said(result)
        errors = [line for line in output.splitlines() if "error:" in line]
        assert len(errors) == 1, said(result)
        assert errors[0].startswith("error: could not write the checkpoint "), errors
        assert cause in errors[0] and "the checkpoint it was to replace is intact" in errors[0], errors
    assert sharded.read_summary(checkpoints(tmp_path / "shards") / "last.ckpt")["global_step"] == 10
    assert "`Trainer.fit` stopped" not in shards.stdout + shards.stderr  # stopped at the save of step 30
    folder = checkpoints(tmp_path / "finishing")
    assert sharded.read_summary(folder / "last.ckpt")["global_step"] == 40  # the one it was to replace
    assert sharded.read_summary(next(folder.glob("best-*.ckpt")))["global_step"] == STEPS
    assert "`Trainer.fit` stopped: `max_epochs=1` reached" in finishing.stdout + finishing.stderr


@pytest.fixture
def group_of_one(tmp_path):
    """A gloo process group of this process alone (what the writer's background group is made from)."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_removal_waits_for_the_save_before_it_and_is_skipped_if_that_failed(tmp_path, group_of_one, monkeypatch):
    release = threading.Event()
    replace = sharded_save.replace

    def held_replace(source: Path, target: Path) -> None:
        release.wait(60)
        if target.name == "full-disk.ckpt":
            raise OSError(errno.ENOSPC, "No space left on device")
        replace(source, target)

    monkeypatch.setattr(sharded_save, "replace", held_replace)
    writer = AsyncShardedWriter()
    writer.setup(None)
    checkpoint = {"state_dict": {"w": torch.arange(4.0)}, "optimizer_states": [], "global_step": 2}
    old, new = tmp_path / "best-1.ckpt", tmp_path / "best-2.ckpt"
    old.mkdir()
    writer.save(checkpoint, new, "t1")
    writer.remove(old)  # ModelCheckpoint: the new best saved, the previous one removed
    time.sleep(0.3)
    assert writer.in_flight and old.is_dir() and not new.exists()
    release.set()
    writer.wait()
    assert not old.exists() and sharded.read_summary(new)["global_step"] == 2
    writer.save(checkpoint, tmp_path / "full-disk.ckpt", "t2")
    writer.remove(new)
    with pytest.raises(ShardedWriteError, match=r"could not write the checkpoint .*full-disk.ckpt \(OSError: "):
        writer.wait()
    assert sharded.is_sharded_checkpoint(new), "a removal behind a failed save ran"
    writer.teardown()
