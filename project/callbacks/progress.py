"""The template's progress bar: Lightning's rich bar, redrawn a few times a second instead of every batch.

``RichProgressBar``'s per-batch metric reads and up to 100 redraws a second (holding the GIL) slow a small model.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar


class ProgressBar(RichProgressBar):
    """A ``RichProgressBar`` whose per-batch updates are rate-limited.

    Args:
        refresh_per_s: Most redraws (and metric reads) per second.
        leave: Leave finished bars on screen (as ``RichProgressBar``).
        console_kwargs: Passed to ``rich.console.Console`` (as ``RichProgressBar``).
    """

    def __init__(
        self, refresh_per_s: float = 10.0, leave: bool = False, console_kwargs: dict[str, Any] | None = None
    ) -> None:
        if refresh_per_s <= 0:
            raise ValueError(f"ProgressBar refresh_per_s={refresh_per_s} must be > 0; use enable_progress_bar: false")
        # RichProgressBar passes refresh_rate to rich as its redraws per second.
        super().__init__(refresh_rate=max(1, round(refresh_per_s)), leave=leave, console_kwargs=console_kwargs)
        self.interval_s = 1.0 / refresh_per_s
        self._last_draw = float("-inf")
        self._pending: tuple[Any, Any, int] | None = None

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """Lightning's bar metrics, the run's version as text (rich formats every number as ``.3f``: "v_num: 0.000")."""
        items = super().get_metrics(trainer, pl_module)
        if "v_num" in items:
            items["v_num"] = str(items["v_num"])
        return items

    def _due(self, current: int, total: float | int | None) -> bool:
        now = time.monotonic()
        # The first and last batch always: the bar's it/s needs two points, its end the final count.
        if current in (1, total) or now - self._last_draw >= self.interval_s:
            self._last_draw = now
            return True
        return False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Update the training bar and its metrics when due."""
        if self.is_enabled:
            due = self._due(batch_idx + 1, self.total_train_batches)
            self._pending = None if due else (outputs, batch, batch_idx)
            if due:
                super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Draw the last batch (a run that stops mid-epoch may have skipped it), then the epoch's metrics."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            super().on_train_batch_end(trainer, pl_module, *pending)
        super().on_train_epoch_end(trainer, pl_module)

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Update the validation bar when due."""
        # Disabled (e.g. on ranks > 0) the loop counters the totals need are not kept.
        if self.is_enabled and self._due(batch_idx + 1, self.total_val_batches_current_dataloader):
            super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Update the test bar when due."""
        if self.is_enabled and self._due(batch_idx + 1, self.total_test_batches_current_dataloader):
            super().on_test_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def on_predict_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Update the prediction bar when due."""
        if self.is_enabled and self._due(batch_idx + 1, self.total_predict_batches_current_dataloader):
            super().on_predict_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)
