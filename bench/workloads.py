"""What is measured: two workloads (per-step overhead vs real compute) and the rows that run them.

Everything a run needs is derived from a :class:`Workload`, so the raw script, plain Lightning and the
template's config can never drift apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Workload:
    """One network, batch, optimizer and step count.

    Args:
        name: Short name used in file names.
        title: What the table calls it.
        hidden: Width of DigitsNet's two hidden layers (each followed by BatchNorm, no dropout).
        batch_size: Samples per step per process.
        steps: Optimizer steps per run.
        warmup: Steps left out of the throughput.
        lr: SGD learning rate.
        momentum: SGD momentum.
        in_features: Width of the synthetic samples.
        num_classes: Number of synthetic classes.
        seed: Seed of the model initialisation (``seed_everything`` in the template).
        data_seed: Seed of the synthetic data and of the shuffling.
        eval_fraction: Share of the data held out for validation, and again for the test.
        max_processes: The most processes any row runs it with (sizes the data set to one epoch).
    """

    name: str
    title: str
    hidden: int
    batch_size: int
    steps: int
    warmup: int
    lr: float = 0.01
    momentum: float = 0.9
    in_features: int = 64
    num_classes: int = 10
    seed: int = 42
    data_seed: int = 0
    eval_fraction: float = 0.01
    max_processes: int = 2

    @property
    def num_samples(self) -> int:
        """Synthetic set size whose training split holds every step of the largest row in one epoch."""
        train = self.steps * self.batch_size * self.max_processes
        return math.ceil(train / (1 - 2 * self.eval_fraction)) + 8

    def net_args(self) -> dict[str, Any]:
        """DigitsNet's init_args."""
        return {
            "in_features": self.in_features,
            "hidden": self.hidden,
            "num_classes": self.num_classes,
            "dropout": 0.0,
            "batch_norm": True,
        }

    def data_args(self) -> dict[str, Any]:
        """SyntheticDataModule's init_args."""
        return {
            "num_samples": self.num_samples,
            "in_features": self.in_features,
            "num_classes": self.num_classes,
            "val_fraction": self.eval_fraction,
            "test_fraction": self.eval_fraction,
            "batch_size": self.batch_size,
            "seed": self.data_seed,
        }

    def template_config(self) -> dict[str, Any]:
        """The config layered over ``configs/digits.yaml``: this workload's net, data, optimizer and steps."""
        return {
            "seed_everything": self.seed,
            "model": {
                "class_path": "project.models.classifier.Classifier",
                "init_args": {
                    "num_classes": self.num_classes,
                    "net": {"class_path": "project.models.digits_net.DigitsNet", "init_args": self.net_args()},
                },
            },
            "data": {"class_path": "project.data.synthetic.SyntheticDataModule", "init_args": self.data_args()},
            "optimizer": {
                "class_path": "torch.optim.SGD",
                "init_args": {"lr": self.lr, "momentum": self.momentum, "weight_decay": 0.0},
            },
            "lr_scheduler": None,
            "trainer": {"max_steps": self.steps},
        }

    def script_args(self) -> list[str]:
        """Arguments shared by ``bench/raw.py`` and ``bench/plain.py`` (``--data`` comes from the harness)."""
        return [
            "--hidden", str(self.hidden),
            "--batch-size", str(self.batch_size),
            "--steps", str(self.steps),
            "--lr", str(self.lr),
            "--momentum", str(self.momentum),
            "--seed", str(self.seed),
            "--data-seed", str(self.data_seed),
        ]  # fmt: skip


@dataclass(frozen=True)
class Row:
    """One line of the throughput table: a workload at a number of processes on a device."""

    workload: Workload
    processes: int
    device: str = "cpu"
    #: The ways that run it (quick mode leaves some out to stay short).
    variants: tuple[str, ...] = ("raw", "floor", "plain", "template")

    @property
    def key(self) -> str:
        """Stable id, e.g. ``small-cpu-2``."""
        return f"{self.workload.name}-{self.device}-{self.processes}"

    @property
    def title(self) -> str:
        """What the table calls it."""
        where = "1 GPU, bf16-mixed" if self.device == "gpu" else f"CPU, {self.processes} process"
        if self.device == "cpu" and self.processes > 1:
            where += "es (DDP, gloo)"
        return f"{self.workload.title}, {where}"


SMALL = Workload("small", "MLP 64-256(BN)-256-10, batch 32", hidden=256, batch_size=32, steps=1500, warmup=150)
MID = Workload("mid", "MLP 64-1024(BN)-1024-10, batch 256", hidden=1024, batch_size=256, steps=200, warmup=30)
# Quick mode: the same code paths in seconds (the test suite runs it); its timings mean nothing.
QUICK_SMALL = replace(SMALL, steps=60, warmup=10)
GPU = replace(MID, name="gpu", steps=600, warmup=100, max_processes=1)


def rows(quick: bool, gpu: bool, ablate: bool = False) -> list[Row]:
    """The throughput rows of a run.

    Args:
        quick: The seconds-long code-path check.
        gpu: One GPU is there: add the GPU row.
        ablate: Also run the template without the callbacks that act on every step.
    """
    if ablate:
        return [replace(row, variants=(*row.variants, "lean")) for row in rows(quick, gpu)]
    if quick:
        return [
            Row(QUICK_SMALL, 1, variants=("raw", "plain", "template")),
            Row(QUICK_SMALL, 2, variants=("raw", "template")),
        ]
    found = [Row(SMALL, 1), Row(SMALL, 2), Row(MID, 1)]
    if gpu:
        found.append(Row(GPU, 1, "gpu"))
    return found


#: The issue's throughput targets: template steps/s over raw steps/s, per row key.
TARGETS = {"small-cpu-1": 0.75, "small-cpu-2": 0.70, "mid-cpu-1": 0.97}
#: Time to the first step may exceed the raw script's by at most this many seconds.
STARTUP_SLACK_S = 2.0
