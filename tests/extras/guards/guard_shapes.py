"""User code for the guards layer's tests (replica guard, fine-tuning): written as users write it.

- :class:`PerturbOneRank`: a callback that changes one rank's weights (a rank-dependent update, a bit flip);
  :class:`CountAllReduces` counts each step's all-reduces.
- :class:`BackboneClassifier`: a plain module with a ``backbone`` attribute, for Lightning's BackboneFinetuning;
  its optimizer takes only what trains when it is built (Lightning's documented recipe). :class:`SelfUnfreezing`
  unfreezes its own backbone; :class:`UnfreezeAddingGroup` is a user's fine-tuning callback that keeps no state.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from preempt_faults import CountCollectives
from torch import Tensor, nn


class PerturbOneRank(L.Callback):
    """After optimizer step ``step``, add ``delta`` to the first weight of rank ``rank`` only."""

    def __init__(self, step: int, rank: int = 1, delta: float = 1e-3) -> None:
        self.step, self.rank, self.delta = step, rank, delta

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        """Perturb this rank's weights once."""
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            with torch.no_grad():
                next(pl_module.parameters()).view(-1)[0] += self.delta


class BackboneClassifier(L.LightningModule):
    """Digits through a small backbone and a head; SGD over the parameters that train when it is built."""

    def __init__(self, lr: float = 0.05, hidden: int = 32) -> None:
        super().__init__()
        self.lr = lr
        self.backbone = nn.Sequential(nn.Linear(64, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, 10)
        self.net = nn.Sequential(self.backbone, self.head)  # what export/ holds (the same parameters)

    def _loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Cross-entropy."""
        loss = self._loss(batch)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Validation loss."""
        self.log("val/loss", self._loss(batch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Only the trainable parameters (the backbone is frozen by BackboneFinetuning at setup)."""
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr)


class SelfUnfreezing(BackboneClassifier):
    """Its backbone frozen in ``__init__`` and unfrozen by its own ``on_train_batch_start`` at ``unfreeze_step``.

    The module's own hook runs after every callback's, once the batch has started: the latest a change can come
    before the forward. Its optimizer holds every parameter from the start (a frozen one has no gradient).
    """

    def __init__(self, lr: float = 0.05, hidden: int = 32, unfreeze_step: int = 30) -> None:
        super().__init__(lr, hidden)
        self.unfreeze_step = unfreeze_step
        self.backbone.requires_grad_(False)

    def on_train_batch_start(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Unfreeze the backbone at the chosen step."""
        if self.trainer.global_step == self.unfreeze_step:
            self.backbone.requires_grad_(True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Every parameter, with momentum (whose state shows which parameters ever had a gradient)."""
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class UnfreezeAddingGroup(L.Callback):
    """A user's own fine-tuning: at ``epoch`` the backbone trains, in a parameter group added then; nothing of it is
    saved, so a resume builds the optimizer with one group where the checkpoint has two."""

    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Frozen before the optimizer is built."""
        pl_module.backbone.requires_grad_(False)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Unfreeze, with a group of its own."""
        if trainer.current_epoch == self.epoch:
            pl_module.backbone.requires_grad_(True)
            trainer.optimizers[0].add_param_group({"params": list(pl_module.backbone.parameters()), "lr": 0.01})


class CountAllReduces(CountCollectives):
    """:class:`CountCollectives` of ``all_reduce`` only: the replica guard's collective, per optimizer step."""

    NAMES = ("all_reduce",)
