"""Code a user would write, not the template's: plugged in by class path (``tests/`` is on PYTHONPATH).

- :class:`PlainDigits`: a plain LightningDataModule with its own shuffled DataLoader, a batch argument that
  is not called ``batch_size``, and an odd-sized test split (45 samples), as issue 11 found them.
- :class:`StreamedDigits`: the same data as an IterableDataset, where the layer cannot install its samplers.
- :class:`ModelAttributeClassifier`: a LightningModule that keeps its network at ``.model``.
- :class:`AugmentedDigits`: random augmentation per (seed, epoch, sample), loaded by worker processes.
"""

from __future__ import annotations

from collections.abc import Iterator

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from project.data.arrays import load_digits_tensors
from project.data.augment import SeededAugmentation
from project.models.classifier import Classifier


def digits_parts(test_size: int = 45, val_size: int = 45) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """The digits in file order: the last ``test_size`` for test, the ``val_size`` before for validation."""
    x, y = load_digits_tensors()
    n = len(x) - test_size - val_size
    return (
        TensorDataset(x[:n], y[:n]),
        TensorDataset(x[n : n + val_size], y[n : n + val_size]),
        TensorDataset(x[n + val_size :], y[n + val_size :]),
    )


class PlainDigits(L.LightningDataModule):
    """A plain datamodule: ``bs`` per loader, ``DataLoader(shuffle=True)`` for training, nothing from the template."""

    def __init__(self, bs: int = 16, test_size: int = 45) -> None:
        super().__init__()
        self.bs = bs
        self.test_size = test_size

    def setup(self, stage: str | None = None) -> None:
        """Split the digits."""
        self.train, self.val, self.test = digits_parts(self.test_size)

    def train_dataloader(self) -> DataLoader:
        """Shuffled, as users write it."""
        return DataLoader(self.train, batch_size=self.bs, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """In order."""
        return DataLoader(self.val, batch_size=self.bs)

    def test_dataloader(self) -> DataLoader:
        """In order."""
        return DataLoader(self.test, batch_size=self.bs)

    def predict_dataloader(self) -> DataLoader:
        """The test set."""
        return DataLoader(self.test, batch_size=self.bs)


class _Stream(IterableDataset):
    def __init__(self, data: TensorDataset) -> None:
        self.data = data

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return iter(zip(*self.data.tensors))


class StreamedDigits(PlainDigits):
    """The same data as an IterableDataset: no indices, so the layer leaves the training loader alone."""

    def train_dataloader(self) -> DataLoader:
        """A stream."""
        return DataLoader(_Stream(self.train), batch_size=self.bs)


class ModelAttributeClassifier(L.LightningModule):
    """Cross-entropy around a network held at ``.model``, with ``val/acc``-free metrics (``val/loss`` only)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.save_hyperparameters()  # under LightningCLI: the config, so the network's class_path and init_args
        self.model = model

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Cross-entropy."""
        x, y = batch
        return nn.functional.cross_entropy(self.model(x), y)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """``val/loss`` only."""
        x, y = batch
        self.log("val/loss", nn.functional.cross_entropy(self.model(x), y), sync_dist=True)


class MisdescribedNet(nn.Module):
    """A network whose ``init_args`` do not describe it: its export would rebuild another network."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.init_args = {"width": width + 1}
        self.layer = nn.Linear(64, width)

    def forward(self, x: Tensor) -> Tensor:
        """Logits (of the wrong width, which no test gets to see)."""
        return self.layer(x)


class SyncRecorder(L.Callback):
    """Write, per micro-batch, whether DDP will all-reduce its gradients (``False`` inside ``no_sync``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.syncs: list[bool] = []

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        """DDP's own flag, as its backward will read it."""
        self.syncs.append(bool(getattr(trainer.strategy.model, "require_backward_grad_sync", True)))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Rank 0 writes the flags, one per line."""
        if trainer.is_global_zero:
            with open(self.path, "w") as handle:
                handle.write("\n".join(str(sync) for sync in self.syncs) + "\n")


def add_noise(sample: tuple[Tensor, Tensor], generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random augmentation drawn from the sample's own generator."""
    x, y = sample
    return x + 0.1 * torch.randn(x.shape, generator=generator), y


class AugmentedDigits(PlainDigits):
    """:class:`PlainDigits` with noise on every training sample, seeded per (seed, epoch, sample)."""

    def __init__(self, bs: int = 16, test_size: int = 45, workers: int = 0) -> None:
        super().__init__(bs, test_size)
        self.workers = workers

    def train_dataloader(self) -> DataLoader:
        """Shuffled, augmented, loaded by ``workers`` processes."""
        augmented = SeededAugmentation(self.train, add_noise, seed=7)
        return DataLoader(augmented, batch_size=self.bs, shuffle=True, num_workers=self.workers)


class UnusedHeadClassifier(Classifier):
    """The digits classifier plus an auxiliary head that ``forward`` never uses: its parameters never get a gradient.

    Under scenario fsdp the head is a network of its own (an FSDP root), sharded, but with no optimizer state.
    """

    def __init__(self, net: nn.Module, num_classes: int = 10, weights: str | None = None) -> None:
        super().__init__(net, num_classes, weights)
        self.aux_head = nn.Linear(64, num_classes)


class ShapedPredictions(Classifier):
    """The digits classifier whose ``predict_step`` returns what users' do, rather than a tensor.

    ``returns``: ``dict``, a mix: ``{"probs": [B, 10] tensor, "label": one string per sample}``;
    ``scalar``: one number for the whole batch, which cannot be written one row per sample.
    """

    def __init__(
        self, net: nn.Module, num_classes: int = 10, weights: str | None = None, returns: str = "dict"
    ) -> None:
        super().__init__(net, num_classes, weights)
        self.returns = returns

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, object] | Tensor:
        """The class probabilities and a label per sample, or their largest value over the batch."""
        probs = torch.softmax(self.net(batch[0]), dim=1)
        if self.returns == "scalar":
            return probs.max()
        return {"probs": probs, "label": [f"digit {int(c)}" for c in probs.argmax(dim=1)]}


class PartlyUsedHeads(Classifier):
    """The digits classifier with an auxiliary head whose loss counts only before step ``aux_until_step``.

    From that step on the head gets no gradient: under DDP without ``parallel.ddp.find_unused_parameters`` from the
    first step (``aux_until_step=0``, a head never trained) or from a later one (a schedule that drops a loss).
    """

    def __init__(
        self, net: nn.Module, num_classes: int = 10, weights: str | None = None, aux_until_step: int = 0
    ) -> None:
        super().__init__(net, num_classes, weights)
        self.aux_head = nn.Linear(64, num_classes)
        self.aux_until_step = aux_until_step

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """The classifier's loss, plus the auxiliary head's on the inputs while the schedule keeps it."""
        loss = super().training_step(batch, batch_idx)
        if self.global_step < self.aux_until_step:
            loss = loss + self.loss_fn(self.aux_head(batch[0]), batch[1])
        return loss


class ManualGAN(L.LightningModule):
    """A GAN on the digits' 64 pixels, optimized by hand (``automatic_optimization = False``), two optimizers."""

    def __init__(self, noise: int = 16) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.noise = noise
        self.generator = nn.Sequential(nn.Linear(noise, 64), nn.Tanh())
        self.discriminator = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """One discriminator step on real and generated samples, then one generator step."""
        opt_g, opt_d = self.optimizers()
        real = batch[0]
        fake = self.generator(torch.randn(real.shape[0], self.noise, device=real.device))
        bce = nn.functional.binary_cross_entropy_with_logits
        ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
        d_loss = bce(self.discriminator(real), ones) + bce(self.discriminator(fake.detach()), zeros)
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        opt_g.zero_grad()
        self.manual_backward(bce(self.discriminator(fake), ones))
        opt_g.step()

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        """Adam for each network."""
        return [
            torch.optim.Adam(self.generator.parameters(), lr=2e-4),
            torch.optim.Adam(self.discriminator.parameters(), lr=2e-4),
        ]
