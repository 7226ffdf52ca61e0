"""A LightningModule for regression: MSE loss, MSE/MAE metrics, around any plain network."""

from __future__ import annotations

from typing import Any

import lightning as L
from torch import Tensor, nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError

from project.export import load_weights
from project.models.hparams import save_config_hyperparameters
from project.models.step_logging import log_on_logged_steps

Batch = tuple[Tensor, Tensor]


class Regressor(L.LightningModule):
    """Train any plain regression network given by config (``class_path``/``init_args``).

    The optimizer and LR scheduler come from the CLI's ``optimizer:``/``lr_scheduler:`` sections.

    Args:
        model: The plain ``nn.Module`` to train; it maps ``[B, F]`` to ``[B, 1]`` (e.g.
            :class:`project.models.mlp.MLP`). Held at ``self.model``.
        weights: Optional path to start from: a plain state dict, a DataParallel/DDP state dict
            (keys prefixed with ``module.``) or a Lightning ``.ckpt``. Loaded with ``weights_only=True``.
    """

    def __init__(self, model: nn.Module, weights: str | None = None) -> None:
        super().__init__()
        save_config_hyperparameters(self, "model")
        self.model = model
        #: Where the starting weights came from (``None``: the network's initialisation); `test` reads it.
        self.weights_from = weights
        if weights is not None:
            load_weights(self.model, weights)
        # Metric objects sync across processes by summing errors and counts: the exact dataset mean.
        self.val_mse = MeanSquaredError()
        self.val_mae = MeanAbsoluteError()
        self.test_mse = MeanSquaredError()
        self.test_mae = MeanAbsoluteError()
        self._train_loss: Tensor | None = None  # the last training step's loss, for on_train_batch_end

    def forward(self, x: Tensor) -> Tensor:
        """Return one prediction per sample, shape ``[B]``."""
        return self.model(x).squeeze(-1)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        """Mean squared error on one (per-device) batch; ``train/loss`` is logged in :meth:`on_train_batch_end`."""
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self._train_loss = loss.detach()
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Log ``train/loss`` on the steps whose metrics the Trainer writes (``self.log`` is not free)."""
        # sync_dist: the global batch's mean at any world size (the ranks' slices are equal), on logged steps only.
        log_on_logged_steps(self, "train/loss", self._train_loss, prog_bar=True, sync_dist=True)

    def _evaluate(self, batch: Batch, mse: MeanSquaredError, mae: MeanAbsoluteError, stage: str) -> None:
        x, y = batch
        prediction = self(x)
        mse.update(prediction, y)
        mae.update(prediction, y)
        self.log(f"{stage}/mse", mse, on_step=False, on_epoch=True, prog_bar=stage == "val")
        self.log(f"{stage}/mae", mae, on_step=False, on_epoch=True)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        """Accumulate ``val/mse`` and ``val/mae`` over the whole validation set."""
        self._evaluate(batch, self.val_mse, self.val_mae, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        """Accumulate ``test/mse`` and ``test/mae`` over the whole test set."""
        self._evaluate(batch, self.test_mse, self.test_mae, "test")

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        """Return the prediction of each sample, shape ``[B]``."""
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x)
