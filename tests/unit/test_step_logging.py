"""Logging a training value only on the logged steps writes the same series as logging it on every step."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import Logger

from project.models.step_logging import log_on_logged_steps


class Recording(Logger):
    """A logger that keeps every (step, name, value) it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[tuple[int, str, float]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.written += [(step, k, v) for k, v in metrics.items() if k == "train/loss"]


class EveryStep(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.log("train/loss", out["loss"].detach(), on_step=True, on_epoch=False)
        return out


class LoggedStepsOnly(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.last = out["loss"].detach()
        return out

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        log_on_logged_steps(self, "train/loss", self.last)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_logged_steps_only_writes_the_series_of_logging_every_step(accumulate):
    written = []
    for module_class in (EveryStep, LoggedStepsOnly):
        torch.manual_seed(0)
        logger = Recording()
        trainer = L.Trainer(
            max_steps=11, log_every_n_steps=3, accumulate_grad_batches=accumulate, limit_val_batches=0,
            logger=logger, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(module_class())
        written.append(logger.written)
    assert len(written[0]) == 11 // 3
    assert written[1] == written[0]
