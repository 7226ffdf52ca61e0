"""One training per run directory: a fit holds ``<run>/.training.lock``; a second fit there is refused in one line.

The lock itself (take, refuse, release, a stale file) in-process and with one small Python holder; then a real
fit holding it while a second ``fit --resume auto`` on the same run is refused and writes nothing, and the resume
after the first one is killed (its lock file left behind) trains.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from project.errors import UserError
from project.run_lock import LOCK_NAME, TrainingLock, holder_of

from helpers import DIGITS, FAST, REPO, cli_env, descendants, run_cli, run_dirs

RUN = Path("logs/digits/version_0")
# Two steps an epoch, so last.ckpt comes at the first epoch end; far more epochs than the test lets it run.
LONG = ["--config", DIGITS, "--config", FAST, "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
LONG += ["--trainer.max_epochs", "100000", "--test_after_fit", "false"]


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str, log: Path | None = None) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` (and the log's tail) at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
            pytest.fail(f"{what} did not happen within {timeout_s} s\n{tail}")
        time.sleep(0.1)


def state(pid: int) -> str:
    """The process's state letter (``T``: stopped), from ``/proc``."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``folder`` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_the_lock_names_its_holder_and_leaves_the_folder_as_it_was(tmp_path):
    run = tmp_path / "version_0"
    run.mkdir()
    os.utime(run, ns=(1_000, 2_000))
    lock = TrainingLock.take(run)
    held = holder_of(run) or {}
    assert (held.get("pid"), held.get("host")) == (os.getpid(), socket.gethostname()) and held.get("since")
    lock.release()
    lock.release()  # idempotent
    assert list(run.iterdir()) == [] and run.stat().st_mtime_ns == 2_000


def test_a_file_left_by_a_dead_holder_blocks_nothing(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 999999, "host": "gone", "since": "then"}))
    lock = TrainingLock.take(tmp_path)
    assert holder_of(tmp_path)["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_only_a_fit_on_rank_zero_of_a_folder_that_exists_locks():
    assert TrainingLock.take(None).fd is None
    assert TrainingLock.take("/nonexistent/run").fd is None


def test_a_lock_held_by_another_process_is_refused_naming_its_pid_and_host(tmp_path):
    hold = "import sys; from project.run_lock import TrainingLock; TrainingLock.take(sys.argv[1]); sys.stdin.read()"
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(tmp_path)], stdin=subprocess.PIPE, cwd=REPO, env=cli_env(), text=True
    )
    try:
        wait_for(lambda: (holder_of(tmp_path) or {}).get("pid") == holder.pid, 30, "the holder's lock")
        with pytest.raises(UserError) as refused:
            TrainingLock.take(tmp_path)
        message = str(refused.value)
        assert f"pid {holder.pid} on host {socket.gethostname()}" in message, message
        assert f"`kill {holder.pid}` on {socket.gethostname()}" in message and "wait for it to end" in message
        assert "\n" not in message
    finally:
        holder.communicate("", timeout=30)  # ends without releasing: the kernel drops the lock, the file stays
    assert holder_of(tmp_path)["pid"] == holder.pid
    TrainingLock.take(tmp_path).release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_second_fit_on_a_training_run_is_refused_and_the_resume_after_it_trains(tmp_path):
    log = tmp_path / "first.log"
    with log.open("w") as out:
        first = subprocess.Popen(
            [sys.executable, "-m", "project", "fit", *LONG], cwd=tmp_path, env=cli_env(), stdout=out, stderr=out
        )
    try:
        last = tmp_path / RUN / "checkpoints" / "last.ckpt"
        wait_for(lambda: (holder_of(tmp_path / RUN) or {}).get("pid") == first.pid, 120, "the first fit's lock", log)
        wait_for(last.is_file, 120, "the first fit's last.ckpt", log)
        # Frozen (the lock stays held), so that whatever changes in the run directory is the second fit's doing.
        frozen = [first.pid, *descendants(first.pid)]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: all(state(pid) == "T" for pid in frozen), 30, "the first fit to stop")
        before = snapshot(tmp_path / "logs")
        second = run_cli(["fit", *LONG, "--resume", "auto"], tmp_path)
        assert snapshot(tmp_path / "logs") == before
    finally:
        for pid in [first.pid, *descendants(first.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert second.returncode == 2, second.stdout + second.stderr
    assert "Traceback" not in second.stderr
    (line,) = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    host = socket.gethostname()
    assert f"{RUN} is training already (pid {first.pid} on host {host}" in line, line
    assert f"`kill {first.pid}` on {host}" in line, line

    # The killed fit left its lock file: it blocks nothing, and the resume continues from last.ckpt.
    assert (tmp_path / RUN / LOCK_NAME).exists()
    # --resume auto continues from the newest good checkpoint: last.ckpt, or the best one when the freeze caught a
    # background write of last.ckpt (the best-*.ckpt of a later epoch is then the newest).
    saved = max(
        torch.load(p, weights_only=False, map_location="cpu")["global_step"] for p in last.parent.glob("*.ckpt")
    )
    resumed = run_cli(["fit", *LONG, "--resume", "auto", "--trainer.max_steps", str(saved + 2)], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [p.name for p in run_dirs(tmp_path)] == ["version_0"]
    assert torch.load(last, weights_only=False, map_location="cpu")["global_step"] == saved + 2
    assert not (tmp_path / RUN / LOCK_NAME).exists()
