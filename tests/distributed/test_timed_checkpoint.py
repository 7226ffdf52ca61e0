"""Checkpoints by time, written in the background: a killed run loses at most the configured time of work.

The schedule is checked with a fake clock; the writer with blocked writes (no sleeps decide anything);
the whole rule with real runs on 1 and 2 processes whose steps have a known pace, killed with SIGKILL
mid-epoch and resumed with ``--resume auto``.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import lightning as L
import pytest
import torch

from project.callbacks.timed_checkpoint import CHECKS_PER_INTERVAL, SaveSchedule, TimedCheckpoint
from project.checkpoints.background import BackgroundCheckpointIO, CheckpointWriteError
from project.checkpoints.loading import safe_load

from helpers import CPU_DDP, DIGITS, FAST, run_cli


# ------------------------------------------------------------------------------ the schedule
def simulate(every_s: float, step_s: list[float]) -> tuple[list[float], int]:
    """Run rank 0's schedule over steps of the given lengths; the times of the saves and how many checks ran."""
    now = [0.0]
    schedule = SaveSchedule(every_s, clock=lambda: now[0])
    schedule.start(0)
    saves, checks, next_check = [], 0, 1
    for step, length in enumerate(step_s, start=1):
        now[0] += length
        if step >= next_check:
            checks += 1
            save, next_check = schedule.check(step)
            assert next_check > step
            if save:
                saves.append(now[0])
                schedule.saved()
    return saves, checks


def test_at_a_steady_pace_the_ranks_save_on_time_and_check_ten_times_an_interval():
    saves, checks = simulate(every_s=1.0, step_s=[0.01] * 1000)  # 10 s of 10 ms steps
    assert len(saves) == 9
    gaps = [b - a for a, b in zip([0.0, *saves], saves)]
    assert all(1.0 <= gap <= 1.0 + 0.01 + 1e-9 for gap in gaps), gaps  # at most one step late
    # One broadcast per check: about CHECKS_PER_INTERVAL per interval, not one per step (1000 steps here).
    assert checks <= (CHECKS_PER_INTERVAL + 2) * 10


def test_when_steps_slow_down_a_save_is_late_by_at_most_one_check_interval_at_the_old_pace():
    slowdown = 5
    saves, _ = simulate(every_s=1.0, step_s=[0.01] * 150 + [0.01 * slowdown] * 200)
    gaps = [b - a for a, b in zip([0.0, *saves], saves)]
    assert max(gaps) <= 1.0 + slowdown * 1.0 / CHECKS_PER_INTERVAL + 0.05, gaps
    assert min(gaps) >= 1.0


def test_one_process_reads_its_clock_and_any_save_restarts_the_count():
    now = [0.0]
    schedule = SaveSchedule(2.0, clock=lambda: now[0])
    schedule.start(0)
    now[0] = 1.9
    assert not schedule.due()
    schedule.saved()  # e.g. the epoch-end checkpoint
    now[0] = 3.8
    assert not schedule.due()
    now[0] = 3.9
    assert schedule.due()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every_s": 0}, "every_s=0 must be > 0"),
        ({"every_n_steps": 0}, "every_n_steps=0 must be >= 1"),
        ({"every_n_epochs": -1}, "every_n_epochs=-1 must be >= 0"),
    ],
)
def test_bad_intervals_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TimedCheckpoint(**kwargs)


# -------------------------------------------------------------------------------- the writer
class BlockedWrites(BackgroundCheckpointIO):
    """A writer whose writes wait until the test lets them go."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.started = threading.Event()

    def write(self, checkpoint, handle) -> None:
        self.started.set()
        assert self.go.wait(30)
        super().write(checkpoint, handle)


def test_a_save_returns_before_the_write_and_writes_the_state_as_it_was(tmp_path):
    io = BlockedWrites()
    weights = torch.zeros(3)
    target = tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": weights}}, target)
    assert io.started.wait(30) and not target.exists()  # the training thread is free; nothing is there yet
    weights.add_(1.0)  # the next optimizer step changes the live tensor
    io.go.set()
    io.teardown()
    assert torch.equal(torch.load(target, weights_only=True)["state_dict"]["w"], torch.zeros(3))
    assert list(tmp_path.iterdir()) == [target]  # no temporary file left


def test_a_read_of_a_file_being_written_waits_for_it_and_a_removal_waits_its_turn(tmp_path):
    io = BlockedWrites()
    target, old = tmp_path / "last.ckpt", tmp_path / "old.ckpt"
    torch.save({"state_dict": {}, "step": 1}, old)
    io.save_checkpoint({"state_dict": {}, "step": 2}, target)
    io.remove_checkpoint(old)
    assert io.started.wait(30)
    threading.Timer(0.2, io.go.set).start()
    assert safe_load(target)["step"] == 2  # blocked until the write finished, then read complete
    io.teardown()
    assert not old.exists()


def test_a_failed_write_is_raised_at_the_next_save_and_the_previous_file_is_intact(tmp_path):
    io = BackgroundCheckpointIO()
    target = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1}, target)
    io.wait()
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where a folder should be")
    io.save_checkpoint({"step": 2}, blocked / "last.ckpt")
    with pytest.raises(CheckpointWriteError, match=r"could not write the checkpoint .*not-a-folder/last.ckpt"):
        io.save_checkpoint({"step": 3}, target)
    assert torch.load(target, weights_only=True)["step"] == 1
    io.save_checkpoint({"step": 2}, blocked / "last.ckpt")
    with pytest.raises(CheckpointWriteError, match="the file it was to replace is intact"):
        io.teardown()


def test_a_failed_write_during_another_error_is_said_not_raised(tmp_path, capsys):
    io = BackgroundCheckpointIO()
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    io.save_checkpoint({"step": 1}, blocked / "last.ckpt")
    try:
        raise RuntimeError("the run's own error")
    except RuntimeError:
        io.teardown()  # as Lightning does while handling the run's error
    assert "warning: could not write the checkpoint" in capsys.readouterr().err


# ------------------------------------------------------------------------------ real runs
EVERY_S = 1.0
# Batches of 8 make an epoch long (157 steps on one process, 78 on two): no epoch-end or best checkpoint
# is written before the kill, so only the time rule can save the work.
SLOW = [
    "--config", FAST, "--data.init_args.batch_size", "8", "--trainer.limit_val_batches", "2",
    "--test_after_fit", "false",
]  # fmt: skip


def timed_config(tmp_path: Path) -> str:
    """``configs/digits.yaml`` with ``TimedCheckpoint(every_s=EVERY_S)``."""
    path = tmp_path / "digits_timed.yaml"
    path.write_text(Path(DIGITS).read_text().replace("every_s: 60\n", f"every_s: {EVERY_S}\n"))
    return str(path)


def callback(class_path: str, **init_args) -> str:
    return "--trainer.callbacks+=" + json.dumps({"class_path": class_path, "init_args": init_args})


@pytest.mark.parametrize(
    ("processes", "kill_step", "sleep_s"),
    [(1, 100, 0.03), pytest.param(2, 60, 0.05, marks=pytest.mark.distributed)],
    ids=["1-process", "2-processes"],
)
def test_a_killed_run_loses_at_most_the_configured_time_of_work(tmp_path, processes, kill_step, sleep_s):
    layout = ["--config", CPU_DDP] if processes > 1 else []
    fit = ["fit", "--config", timed_config(tmp_path), *layout, *SLOW, "--trainer.max_steps", str(kill_step + 5)]
    stamps, killed_at = tmp_path / "steps.txt", tmp_path / "killed.txt"
    slow = callback("resume_faults.SlowStampedSteps", sleep_s=sleep_s, stamps=str(stamps))
    kill = callback("faults.KillAtStep", step=kill_step, rank=processes - 1, stamp=str(killed_at))
    killed = run_cli([*fit, slow, kill], tmp_path)
    assert killed.returncode != 0, killed.stderr[-3000:]
    ended = {int(step): float(at) for step, at in (line.split() for line in stamps.read_text().splitlines())}
    kill_time = float(killed_at.read_text())
    assert kill_time - ended[1] > 2.5 * EVERY_S, "the run must train well past one interval before the kill"

    resumed = run_cli([*fit, "--resume", "auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    found = re.search(r"Resuming from \S+/last\.ckpt \(epoch 0, step (\d+)\)", resumed.stderr)
    assert found, resumed.stderr[-3000:]
    step = int(found.group(1))
    # The work lost: from the end of the resumed step to the kill. At most the interval, plus one step and
    # the write of one checkpoint (a kill during a write loses back to the previous one); 1 s covers both.
    lost = kill_time - ended[step]
    assert 0 < lost <= EVERY_S + 1.0, (step, lost)
    assert (
        torch.load(tmp_path / "logs/digits/version_0/checkpoints/last.ckpt", weights_only=True)["global_step"]
        == kill_step + 5
    )


class Net(L.LightningModule):
    """Four numbers in, one out; records the micro-batch each checkpoint was saved after."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.saved_at: list[tuple[int, int]] = []

    def training_step(self, batch, batch_idx):
        self.batch_idx = batch_idx
        return self.layer(batch[0]).pow(2).mean()

    def on_save_checkpoint(self, checkpoint) -> None:
        self.saved_at.append((self.trainer.global_step, self.batch_idx))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_saves_come_after_optimizer_steps_never_between_accumulated_micro_batches(tmp_path):
    model = Net()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4)), batch_size=4)
    trainer = L.Trainer(
        max_steps=6, accumulate_grad_batches=2, logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0,
        callbacks=[TimedCheckpoint(every_s=None, every_n_steps=2, every_n_epochs=0, dirpath=str(tmp_path))],
    )  # fmt: skip
    trainer.fit(model, data)
    # Steps 2, 4, 6, each right after the second micro-batch of its step (batch_idx 3, 7, 11).
    assert model.saved_at == [(2, 3), (4, 7), (6, 11)]
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 6
