"""Test-only faults for the elastic tests, added with ``--trainer.callbacks+=...`` (``tests/`` is on PYTHONPATH).

- :class:`KillNodeOnce`: one "node" (a torchrun agent and its workers, one process group) dies by SIGKILL at a
  chosen step, the first time only.
- :class:`SlowAtWorldSize`: steps of a known minimum length while the job runs at a given world size, so that a test
  has time to start a node again before the job ends.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L


class KillNodeOnce(L.Callback):
    """At ``step``, the worker of local rank 0 on node ``node`` SIGKILLs its agent and every worker of it, once.

    torchrun starts each worker in a session of its own, so the node is the agent's process group (the test starts
    each agent in a session of its own) and each worker's: the agent's other workers are killed first, then the
    agent's group, then this worker, so that the node is gone within a step, as a machine that lost its power.
    """

    def __init__(self, step: int, marker: str, node: int = 1) -> None:
        self.step, self.marker, self.node = step, Path(marker), node

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Kill the node at the chosen step, the first time only."""
        on_node = int(os.environ.get("GROUP_RANK", "-1")) == self.node and int(os.environ.get("LOCAL_RANK", "0")) == 0
        if trainer.global_step == self.step and on_node and not self.marker.exists():
            self.marker.write_text(f"{trainer.world_size}\n")
            agent = os.getppid()
            for worker in _children(agent):
                if worker != os.getpid():
                    os.kill(worker, signal.SIGKILL)
            os.killpg(os.getpgid(agent), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


class SlowAtWorldSize(L.Callback):
    """Each optimizer step lasts at least ``seconds`` while the job runs at ``world_size`` processes."""

    def __init__(self, world_size: int, seconds: float) -> None:
        self.world_size, self.seconds = world_size, seconds

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Sleep at the chosen size (a stop signal meanwhile is noted by the template's handler)."""
        if trainer.world_size == self.world_size:
            time.sleep(self.seconds)
