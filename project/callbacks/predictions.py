"""Write what ``predict`` returns to ``<run>/predictions.csv``, in dataset order, once per sample.

Rows are ``index,prediction``: a class id or a number as it is; a vector per sample (probabilities, a
regression of several targets) as one quoted JSON list, so every row stays two columns
(``3,"[0.1, 0.7, 0.2]"``).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from project.checkpoints.atomic import atomic_write_text
from project.errors import UserError
from project.parallel.sampling import EvalShardSampler
from project.runs import run_directory


def _cell(value: torch.Tensor) -> Any:
    """One sample's prediction: a scalar as it is, anything larger as a JSON list."""
    return value.item() if value.numel() == 1 else json.dumps(value.tolist())


def _ordered_shards(loader: Any) -> bool:
    """Whether ``loader`` samples with the layer's ordered shards (Lightning wraps predict's batch sampler)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    samplers = (getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None))
    return any(isinstance(sampler, EvalShardSampler) for sampler in samplers)


def prediction_rows(predictions: torch.Tensor) -> str:
    """The CSV text, header included, for predictions in dataset order (first dimension: samples)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["index", "prediction"])
    writer.writerows((i, _cell(p)) for i, p in enumerate(predictions))
    return out.getvalue()


class PredictionsWriter(L.Callback):
    """Collect each rank's predictions and let rank 0 write them as ``index,prediction`` rows.

    The parallel layer gives each rank one contiguous, unpadded shard
    (:class:`~project.parallel.sampling.EvalShardSampler`), so the ranks' outputs in rank order are the
    dataset order, each sample once. A multi-process ``predict`` over a loader without it is refused.

    Args:
        filename: Name of the CSV file inside the run directory.
    """

    def __init__(self, filename: str = "predictions.csv") -> None:
        self.filename = filename
        self._outputs: list[torch.Tensor] = []
        #: Where the last predictions went (rank 0).
        self.path: Path | None = None

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse, before predicting, several processes whose shards would not give the dataset order."""
        if trainer.world_size == 1:
            return
        loaders = trainer.predict_dataloaders
        loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
        if not all(_ordered_shards(loader) for loader in loaders):
            raise UserError(
                f"predict on {trainer.world_size} processes: the predict loader's samples cannot be put in "
                "dataset order (see plan.json guarantees.predict); run predict on one process"
            )

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
        local = torch.cat(self._outputs) if self._outputs else torch.empty(0)
        shards = [local]
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            shards = [torch.empty(0)] * trainer.world_size
            dist.all_gather_object(shards, local)
        log_dir = run_directory(trainer)
        if not trainer.is_global_zero or log_dir is None:
            return
        self.path = Path(log_dir) / self.filename
        atomic_write_text(self.path, prediction_rows(torch.cat([s for s in shards if s.numel()] or [local])))
