"""Write what ``predict`` returns to ``<run>/predictions.csv``, in dataset order, once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from project.atomic import atomic_write_text


class PredictionsWriter(L.Callback):
    """Collect each rank's predictions and let rank 0 write them as ``index,prediction`` rows.

    The evaluation shards are contiguous and unpadded (project.parallel.sampling.EvalShardSampler),
    so concatenating the ranks' outputs in rank order gives the dataset order, each sample once.

    Args:
        filename: Name of the CSV file inside the run directory.
    """

    def __init__(self, filename: str = "predictions.csv") -> None:
        self.filename = filename
        self._outputs: list[torch.Tensor] = []
        #: Where the last predictions went (rank 0).
        self.path: Path | None = None

    def on_predict_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start a fresh collection."""
        self._outputs = []

    def on_predict_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, *_: Any
    ) -> None:
        """Keep this batch's predictions on the CPU."""
        if isinstance(outputs, torch.Tensor):
            self._outputs.append(outputs.detach().cpu())

    def on_predict_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Gather every rank's predictions (uneven shards: gathered as objects) and write them on rank 0."""
        local = torch.cat(self._outputs) if self._outputs else torch.empty(0, dtype=torch.long)
        shards = [local]
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            shards = [torch.empty(0)] * trainer.world_size
            dist.all_gather_object(shards, local)
        log_dir = trainer.log_dir  # every rank: it broadcasts
        if not trainer.is_global_zero or log_dir is None:
            return
        predictions = torch.cat(shards).tolist()
        rows = "".join(f"{i},{p}\n" for i, p in enumerate(predictions))
        self.path = Path(log_dir) / self.filename
        atomic_write_text(self.path, "index,prediction\n" + rows)
