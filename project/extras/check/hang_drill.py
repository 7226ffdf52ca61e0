"""``check --hang_drill``: a stall on purpose, so a user sees the hang report before a long job needs one.

The last rank stops in a training step (it sleeps, as code stuck in a read or a lock would); the others wait for
it in the gradient all-reduce. Half the process group's timeout (``--join_timeout_s``) later every rank writes its
record into ``hang/`` beside the report (``--out``), rank 0 compares them, and at the timeout the run ends as a
real hang does: exit code 1, one line naming the stalled rank and where it is. Rank 0 prints the summary first.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import lightning as L

from project.errors import UserError


def stall_on_purpose(limit_s: float) -> None:
    """Sleep past any timeout: the drill's stalled rank (its stack shows this function)."""
    time.sleep(limit_s)


class HangDrill(L.Callback):
    """The last rank stalls at training step ``step``; rank 0 prints ``hang/summary.txt`` when the run fails.

    Args:
        step: The training step the last rank stalls in.
        folder: Where ``hang/`` goes (the report's folder).
        timeout_s: The process group's timeout: the stall outlasts it.
    """

    def __init__(self, step: int, folder: Path, timeout_s: float) -> None:
        self.step, self.folder, self.timeout_s = step, folder, timeout_s

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Refuse the drill on one process: there is no one to wait for the stalled rank."""
        if trainer.world_size < 2:
            raise UserError(
                "--hang_drill needs several processes (a stall is one rank that the others wait for); "
                "run check with a multi-process layout, e.g. --config configs/parallel/cpu_ddp.yaml"
            )

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        """The last rank stalls in this step; the others go on into its gradient all-reduce."""
        if trainer.global_step == self.step and trainer.global_rank == trainer.world_size - 1:
            print(f"hang drill: rank {trainer.global_rank} stalls in training step {self.step} on purpose", flush=True)
            stall_on_purpose(self.timeout_s * 10)

    def on_exception(self, trainer: L.Trainer, pl_module: Any, exception: BaseException) -> None:
        """Rank 0: show the summary the ranks' records made (written at the stall threshold, before the timeout)."""
        summary = self.folder / "hang" / "summary.txt"
        if trainer.is_global_zero and summary.is_file():
            sys.stdout.write(f"hang drill: {summary}\n\n{summary.read_text()}\n")
            sys.stdout.flush()
