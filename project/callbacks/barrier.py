"""The seed's ``synchronize()`` at chosen points of a run: a named barrier that never hangs silently.

The ranks missing after ``timeout_s`` are named; the slowest and fastest waits are logged, so stragglers show.
"""

from __future__ import annotations

import lightning as L
import torch

from project.callbacks.finite import gather_ranks
from project.parallel.ddp import synchronize

POINTS = ("setup", "fit_start", "train_epoch_end", "validation_epoch_end", "test_start", "fit_end")


class BarrierCallback(L.Callback):
    """Named, timed barriers at configurable points of a run.

    Args:
        points: Where to synchronise; any of setup, fit_start, train_epoch_end, validation_epoch_end,
            test_start, fit_end.
        timeout_s: Seconds to wait before failing with the names of the missing ranks (at most
            ``parallel.timeout_s``, the run's bound on every collective).
        log_waits: Log the slowest/fastest wait per barrier to the logger.
    """

    def __init__(self, points: list[str] | None = None, timeout_s: float = 300.0, log_waits: bool = True) -> None:
        chosen = list(POINTS if points is None else points)
        unknown = [p for p in chosen if p not in POINTS]
        if unknown:
            raise ValueError(f"BarrierCallback points {unknown} are unknown; choose from {list(POINTS)}")
        if timeout_s <= 0:
            raise ValueError(f"BarrierCallback timeout_s={timeout_s} must be > 0")
        self.points, self.timeout_s, self.log_waits = set(chosen), timeout_s, log_waits
        #: The run's ``parallel.timeout_s`` (the CLI sets it): no barrier waits longer than any other collective.
        self.group_timeout_s: float | None = None
        #: (point, min wait, max wait) of every barrier this process passed, for inspection.
        self.history: list[tuple[str, float, float]] = []

    def _barrier(self, trainer: L.Trainer, point: str) -> None:
        if point not in self.points or trainer.world_size == 1:
            return
        # Every rank takes part in the gather; only rank 0 writes.
        timeout_s = min(self.timeout_s, self.group_timeout_s or self.timeout_s)
        waits = gather_ranks(trainer, torch.tensor(synchronize(point, timeout_s), dtype=torch.float64))
        low, high = float(waits.min()), float(waits.max())
        self.history.append((point, low, high))
        if self.log_waits and trainer.is_global_zero and trainer.logger is not None:
            metrics = {f"barrier/{point}/wait_s_max": high, f"barrier/{point}/wait_s_min": low}
            trainer.logger.log_metrics(metrics, step=trainer.global_step)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Barrier after setup (all ranks built their model and data)."""
        self._barrier(trainer, "setup")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Barrier before the first step."""
        self._barrier(trainer, "fit_start")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Barrier at the end of each training epoch."""
        self._barrier(trainer, "train_epoch_end")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Barrier at the end of each validation epoch (skipped during the sanity check)."""
        if not trainer.sanity_checking:
            self._barrier(trainer, "validation_epoch_end")

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Barrier before testing."""
        self._barrier(trainer, "test_start")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Barrier when fitting is done."""
        self._barrier(trainer, "fit_end")
