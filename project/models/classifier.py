"""The LightningModule: loss, metrics and the train/val/test/predict steps around a plain network."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from project.export import load_weights
from project.models.hparams import save_config_hyperparameters
from project.models.step_logging import log_on_logged_steps

Batch = tuple[Tensor, Tensor]


class Classifier(L.LightningModule):
    """Train any plain classification network given by config (``class_path``/``init_args``).

    The optimizer and LR scheduler come from the CLI's ``optimizer:``/``lr_scheduler:`` sections.

    Args:
        net: The plain ``nn.Module`` to train (e.g. :class:`project.models.digits_net.DigitsNet`).
        num_classes: Number of classes, for the accuracy metrics.
        weights: Optional path to start from: a plain state dict, a DataParallel/DDP state dict
            (keys prefixed with ``module.``) or a Lightning ``.ckpt``. Loaded with ``weights_only=True``.
    """

    def __init__(self, net: nn.Module, num_classes: int = 10, weights: str | None = None) -> None:
        super().__init__()
        save_config_hyperparameters(self, "net")
        self.net = net
        #: Where the starting weights came from (``None``: the network's initialisation); `test` reads it.
        self.weights_from = weights
        if weights is not None:
            load_weights(self.net, weights)
        self.loss_fn = nn.CrossEntropyLoss()
        # Metric objects sync across processes by summing counts, so every rank's samples weigh the same.
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self._train_loss: Tensor | None = None  # the last training step's loss, for on_train_batch_end

    def forward(self, x: Tensor) -> Tensor:
        """Return logits."""
        return self.net(x)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        """Cross-entropy on one (per-device) batch; ``train/loss`` is logged in :meth:`on_train_batch_end`."""
        x, y = batch
        loss = self.loss_fn(self.net(x), y)
        self._train_loss = loss.detach()
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Log ``train/loss`` on the steps whose metrics the Trainer writes (``self.log`` is not free)."""
        # sync_dist: the global batch's mean at any world size (the ranks' slices are equal), on logged steps only.
        log_on_logged_steps(self, "train/loss", self._train_loss, prog_bar=True, sync_dist=True)

    def _evaluate(self, batch: Batch, stage: str, loss: MeanMetric, acc: MulticlassAccuracy) -> None:
        x, y = batch
        logits = self.net(x)
        loss.update(self.loss_fn(logits, y), weight=y.numel())  # weighted: uneven shards give the exact mean
        acc.update(logits, y)
        self.log(f"{stage}/loss", loss, on_step=False, on_epoch=True)
        self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True, prog_bar=stage == "val")

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        """Accumulate ``val/loss`` and ``val/acc`` over the whole validation set."""
        self._evaluate(batch, "val", self.val_loss, self.val_acc)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        """Accumulate ``test/loss`` and ``test/acc`` over the whole test set."""
        self._evaluate(batch, "test", self.test_loss, self.test_acc)

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        """Return the predicted class of each sample."""
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return torch.argmax(self.net(x), dim=1)
