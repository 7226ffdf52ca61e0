"""Test-only faults and probes for the FSDP tests, added by class path (``tests/`` is on PYTHONPATH)."""

from __future__ import annotations

import collections
import errno
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L

from project.extras.sharding.checkpoints import save as sharded_save
from project.models.classifier import Classifier

from helpers import descendants


class _AtFinish(L.Callback):
    """Act on rank 0 where a sharded save of global step ``step`` (to a file named ``name``; ``None``: any) is
    complete but not yet under its name (every rank's shards, DCP's ``.metadata`` and ``meta.pt`` are written).

    The save's step is taken when it is saved (``on_save_checkpoint``, on the training thread): its swap happens
    later, on the writer thread, when the training has moved on. Saves are swapped in the order they were made.
    """

    def __init__(self, step: int, name: str | None = "last.ckpt") -> None:
        self.step = step
        self.name = name
        self._saved: collections.deque[int] = collections.deque()

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._saved.append(trainer.global_step)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        replace = sharded_save.replace

        def finishing(source: Path, target: Path) -> None:
            step = self._saved.popleft() if self._saved else trainer.global_step
            if trainer.global_rank == 0 and step == self.step and self.name in (None, target.name):
                self.fault(trainer)
            replace(source, target)

        sharded_save.replace = finishing

    def fault(self, trainer: L.Trainer) -> None:
        raise NotImplementedError


class KillBeforeShardedRename(_AtFinish):
    """SIGKILL global rank 0 when a sharded save of global step ``step`` is complete but not yet under its name.

    The one rename that would make it ``last.ckpt`` never happens. (The other rank then loses rank 0 in the barrier.)
    """

    def __init__(self, step: int) -> None:
        super().__init__(step, name=None)

    def fault(self, trainer: L.Trainer) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class NanInOneShard(Classifier):
    """The digits classifier whose gradient is nan in one element of rank ``rank``'s shard at global step ``step``.

    The loss stays finite on every rank and the other rank's shard stays finite: only a verdict that the ranks
    agree on (not each rank's look at its own shard) stops them all before that update.
    """

    def __init__(self, *args, step: int = 3, rank: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.nan_step = step
        self.nan_rank = rank

    def on_after_backward(self) -> None:
        """After FSDP's reduce-scatter: spoil one element of this rank's shard of the first weight's gradient."""
        if self.trainer.global_step == self.nan_step and self.trainer.global_rank == self.nan_rank:
            grad = next(self.parameters()).grad
            local = grad.to_local() if hasattr(grad, "to_local") else grad
            local.view(-1)[0] = float("nan")


class GradientSyncRecorder(L.Callback):
    """Write, per micro-batch, whether FSDP will reduce-scatter its gradients (what ``block_backward_sync`` sets)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.syncs: list[bool] = []

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: object) -> None:
        """FSDP2's own flag on every unit (torch has no public getter): all True, or all False."""
        from torch.distributed.fsdp import FSDPModule

        flags = {
            group.reduce_grads
            for unit in pl_module.modules()
            if isinstance(unit, FSDPModule)
            for group in unit._get_fsdp_state()._fsdp_param_groups
        }
        assert len(flags) == 1, flags
        self.syncs.append(flags.pop())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Rank 0 writes the flags, one per line."""
        if trainer.is_global_zero:
            Path(self.path).write_text("\n".join(str(sync) for sync in self.syncs) + "\n")


# Background (async) sharded saves: tests/extras/sharding/distributed/test_async_sharded_save.py
class KillWhileWriting(_AtFinish):
    """SIGKILL every rank once the training is two steps past the save being written (on the writer thread)."""

    def fault(self, trainer: L.Trainer) -> None:
        assert threading.current_thread() is not threading.main_thread(), "the save was not written in the background"
        deadline = time.monotonic() + 60
        while trainer.global_step < self.step + 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        sys.stderr.write(f"fault: killing every rank at step {trainer.global_step}, step {self.step} unswapped\n")
        sys.stderr.flush()
        for pid in descendants(os.getpid()):  # rank 1 (Lightning's launcher starts it from rank 0)
            os.kill(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


class FailFinishing(_AtFinish):
    """Rank 0's ``meta.pt`` and swap fail, as on a full disk."""

    def fault(self, trainer: L.Trainer) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


class FailShards(L.Callback):
    """Rank ``rank``'s DCP write of its shards fails at global step ``step``, as on a full disk."""

    def __init__(self, step: int, rank: int = 1) -> None:
        self.step = step
        self.rank = rank

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        shard_writer = sharded_save.shard_writer

        def failing(partial: Path) -> Any:  # on the training thread, at the save
            writer = shard_writer(partial)
            if trainer.global_rank == self.rank and trainer.global_step == self.step:

                def write_data(plan: Any, planner: Any) -> Any:
                    raise OSError(errno.ENOSPC, "No space left on device")

                writer.write_data = write_data  # type: ignore[method-assign]
            return writer

        sharded_save.shard_writer = failing
