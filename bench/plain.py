"""Plain Lightning: a minimal LightningModule with one ``self.log`` per step and Trainer defaults.

    python -m bench.plain --data train.pt --steps 2000 [--devices 2] [--bare]

The same network, tensors, batch order, optimizer and step count as ``bench/raw.py``; everything
else is what ``lightning.Trainer`` does by default (progress bar, TensorBoard logger, checkpoint,
model summary, DDP with its default flags when ``--devices`` > 1).

``--bare`` is Lightning's floor: ``Trainer(barebones=True)`` (no logger, progress bar, checkpoint,
model summary, sanity check or profiler), no ``self.log`` and, under DDP, the raw script's
``broadcast_buffers=False``: Lightning's training loop alone. Nothing built on the Trainer's automatic
optimization can be faster than this.
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, Dataset

from bench.raw import network, optimizer_of, training_set
from bench.tasks import tasks
from bench.timing import StepTimer
from project.parallel.ddp import ddp_buffer_kwargs
from project.parallel.samplers import GlobalBatchSampler


class PlainModule(L.LightningModule):
    """What a user writes first: forward, loss, one ``self.log``, an optimizer."""

    def __init__(
        self, net: torch.nn.Module, loss_fn: Any, lr: float, momentum: float, log: bool = True, optimizer: str = "sgd"
    ) -> None:
        super().__init__()
        self.net, self.loss_fn = net, loss_fn
        self.lr, self.momentum, self.log_loss, self.optimizer = lr, momentum, log, optimizer

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.loss_fn(self.net(x), y)
        if self.log_loss:
            self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return optimizer_of(self.optimizer, self.parameters(), self.lr, self.momentum)


class PlainData(L.LightningDataModule):
    """The bench tensors in the template's world-size-invariant order (a DistributedSampler, so kept as is)."""

    def __init__(self, dataset: Dataset, batch_size: int, seed: int, pin_memory: bool, collate: Any = None) -> None:
        super().__init__()
        self.dataset, self.batch_size, self.seed, self.pin_memory = dataset, batch_size, seed, pin_memory
        self.collate = collate

    def train_dataloader(self) -> DataLoader:
        dataset = self.dataset
        world, rank = self.trainer.world_size, self.trainer.global_rank
        sampler = GlobalBatchSampler(dataset, self.batch_size, num_replicas=world, rank=rank, seed=self.seed)
        return DataLoader(
            dataset, batch_size=self.batch_size, sampler=sampler, pin_memory=self.pin_memory, collate_fn=self.collate
        )


def main() -> None:
    parser = argparse.ArgumentParser(description="Plain Lightning with Trainer defaults.")
    parser.add_argument("--data", required=True)
    parser.add_argument("--task", choices=("classification", *tasks()), default="classification")
    parser.add_argument("--block-size", type=int, default=0)
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--bare", action="store_true", help="Lightning's floor: barebones Trainer, no self.log")
    args = parser.parse_args()

    tensors = torch.load(args.data, weights_only=True)
    torch.manual_seed(args.seed)
    net, loss_fn = network(args.task, tensors["x"].shape[1] if "x" in tensors else 0, args.hidden, args.block_size)
    model = PlainModule(net, loss_fn, args.lr, args.momentum, log=not args.bare, optimizer=args.optimizer)
    dataset, collate = training_set(args.task, tensors, args.block_size)
    data = PlainData(dataset, args.batch_size, args.data_seed, pin_memory=args.accelerator == "gpu", collate=collate)
    strategy: str | DDPStrategy = "auto"
    if args.bare and args.devices > 1:
        # The floor measures Lightning's loop, not a DDP flag: the raw script's broadcast_buffers=False.
        strategy = DDPStrategy(**ddp_buffer_kwargs(False))
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=strategy,
        precision=args.precision,
        max_steps=args.steps,
        callbacks=[StepTimer()],
        barebones=args.bare,  # Lightning's own "measure my overhead" mode
    )
    trainer.fit(model, datamodule=data)


if __name__ == "__main__":
    main()
