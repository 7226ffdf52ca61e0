"""Test-only callback: each rank writes when its process started and when it reached its first training step.

Added with ``--trainer.callbacks+=early_launch_probe.StartStamps --trainer.callbacks.init_args.folder DIR``
(``tests/`` is on PYTHONPATH). This module is imported while the callbacks are built, after Lightning, so
:data:`IMPORTED_BOOT_S` is a moment at which this process had finished importing Lightning.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import lightning as L

from project.checkpoints.atomic import atomic_write_text

#: Seconds since boot (the clock of ``/proc/<pid>/stat``) when this module was imported: after ``import lightning``.
IMPORTED_BOOT_S = time.clock_gettime(time.CLOCK_BOOTTIME)


def process_start_boot_s(pid: int) -> float:
    """When process ``pid`` started, in seconds since boot (field 22 of ``/proc/<pid>/stat``, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


class StartStamps(L.Callback):
    """At the first training batch, write ``rank<global rank>.json``: pid, parent pid, start and import times."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.done = False

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if self.done:
            return
        self.done = True
        stamp = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "started_boot_s": process_start_boot_s(os.getpid()),
            "imported_boot_s": IMPORTED_BOOT_S,
            "first_step_boot_s": time.clock_gettime(time.CLOCK_BOOTTIME),
            "first_step_wall": time.time(),
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.folder / f"rank{trainer.global_rank}.json", json.dumps(stamp))


class DieWhileBuilding(L.Callback):
    """SIGKILL local rank ``rank`` while the callbacks are built: a rank lost before the ranks meet."""

    def __init__(self, rank: int = 1) -> None:
        if os.environ.get("LOCAL_RANK") == str(rank):
            os.kill(os.getpid(), signal.SIGKILL)
