"""What is measured: the workloads (per-step overhead, real compute, a layer's task) and the rows that run them.

Everything a run needs is derived from a :class:`Workload`, so the raw script, plain Lightning and the
template's config can never drift apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.tasks import default_rows, task

#: The sharding layer's ``layer.py``: its rows (tensor parallelism, FSDP x TP) run where it is installed.
SHARDING = Path(__file__).resolve().parents[1] / "project" / "extras" / "sharding" / "layer.py"

if TYPE_CHECKING:
    from bench.pipeline import Pipeline


@dataclass(frozen=True)
class Workload:
    """One task, network, batch, optimizer and step count.

    Args:
        name: Short name used in file names.
        title: What the table calls it.
        hidden: Width of the two hidden layers: DigitsNet's (each followed by BatchNorm, no dropout) for
            ``classification``; a layer's task reads it its way (the regression's MLP, the GPT's width).
        batch_size: Samples per step per process.
        steps: Optimizer steps per run.
        warmup: Steps left out of the throughput.
        lr: Learning rate.
        momentum: SGD momentum (not used by AdamW).
        in_features: Width of the synthetic samples.
        num_classes: Number of synthetic classes (classification).
        seed: Seed of the model initialisation (``seed_everything`` in the template).
        data_seed: Seed of the synthetic data and of the shuffling.
        eval_fraction: Share of the data held out for validation, and again for the test.
        max_processes: The most processes any row runs it with (sizes the data set to one epoch).
        task: ``classification`` (``Classifier``, cross-entropy, ``configs/digits.yaml``) or a layer's task
            (``bench/tasks.py``, e.g. ``regression``: the diabetes layer's ``Regressor``; ``chargpt``: the GPT
            layer's language model).
        block_size: Tokens per sample (a language model's task); 0 for the MLPs.
        optimizer: ``sgd`` (with ``momentum``) or ``adamw`` (its defaults but ``lr``).
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
    task: str = "classification"
    block_size: int = 0
    optimizer: str = "sgd"

    @property
    def num_samples(self) -> int:
        """Synthetic set size whose training split holds every step of the largest row in one epoch."""
        train = self.steps * self.batch_size * self.max_processes
        return math.ceil(train / (1 - 2 * self.eval_fraction)) + 8

    @property
    def base_config(self) -> str:
        """The template's own config for the task, which the workload is layered over (relative to the repo)."""
        if (extra := task(self.task)) is not None:
            return extra.BASE_CONFIG
        return "configs/digits.yaml"

    def net_args(self) -> dict[str, Any]:
        """The network's init_args: DigitsNet's, or a layer's task's own."""
        if (extra := task(self.task)) is not None:
            return extra.net_args(self)
        return {
            "in_features": self.in_features,
            "hidden": self.hidden,
            "num_classes": self.num_classes,
            "dropout": 0.0,
            "batch_norm": True,
        }

    @property
    def data_class(self) -> str:
        """The datamodule's class path."""
        if (extra := task(self.task)) is not None:
            return extra.DATA_CLASS
        return "bench.synthetic.SyntheticDataModule"

    def data_args(self) -> dict[str, Any]:
        """The datamodule's init_args."""
        if (extra := task(self.task)) is not None:
            return extra.data_args(self)
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
        """The config layered over :attr:`base_config`: this workload's net, data, optimizer and steps."""
        if (extra := task(self.task)) is not None:
            model = extra.model_config(self)
        else:
            net = {"class_path": "project.models.digits_net.DigitsNet", "init_args": self.net_args()}
            model = {
                "class_path": "project.models.classifier.Classifier",
                "init_args": {"num_classes": self.num_classes, "net": net},
            }
        return {
            "seed_everything": self.seed,
            "model": model,
            "data": {"class_path": self.data_class, "init_args": self.data_args()},
            "optimizer": self._optimizer_config(),
            "lr_scheduler": None,
            # The language model validates once, after the last measured step (the MLPs' one epoch does the same).
            # Logged every 50 steps, Lightning's default as in bench/plain.py (configs/digits.yaml says 10: its epochs
            # are 19 steps, and Lightning warns when the interval is longer than an epoch).
            "trainer": {
                "max_steps": self.steps,
                "log_every_n_steps": 50,
                **({"val_check_interval": self.steps} if self.block_size else {}),
            },
        }

    def _optimizer_config(self) -> dict[str, Any]:
        if self.optimizer == "adamw":
            return {"class_path": "torch.optim.AdamW", "init_args": {"lr": self.lr}}
        sgd = {"lr": self.lr, "momentum": self.momentum, "weight_decay": 0.0}
        return {"class_path": "torch.optim.SGD", "init_args": sgd}

    def script_args(self) -> list[str]:
        """Arguments shared by ``bench/raw.py`` and ``bench/plain.py`` (``--data`` comes from the harness)."""
        return [
            "--task", self.task,
            "--hidden", str(self.hidden),
            "--batch-size", str(self.batch_size),
            "--steps", str(self.steps),
            "--lr", str(self.lr),
            "--momentum", str(self.momentum),
            "--seed", str(self.seed),
            "--data-seed", str(self.data_seed),
            "--optimizer", self.optimizer,
            "--block-size", str(self.block_size),
        ]  # fmt: skip


@dataclass(frozen=True)
class Row:
    """One line of the throughput table: a workload at a number of processes on a device."""

    workload: Workload
    processes: int
    device: str = "cpu"
    #: The ways that run it, in run order (quick mode leaves some out to stay short). The template runs between
    #: the two ways its targets compare it with, so each of its ratios is of runs minutes apart at most.
    variants: tuple[str, ...] = ("raw", "floor", "template", "plain")
    #: Processes that split each layer (the template's ``parallel.tensor_parallel.size``; 1: none).
    tensor_parallel: int = 1
    #: With ``tensor_parallel``: FSDP over the data-parallel degree (2-D), instead of one tensor-parallel group.
    fsdp: bool = False
    #: Pipeline stages, schedule and micro-batches (``bench.pipeline``; None: no pipeline).
    pipeline: Pipeline | None = None

    @property
    def key(self) -> str:
        """Stable id, e.g. ``small-cpu-2``, ``chargpt-cpu-4-tp2-fsdp`` or ``chargpt-cpu-2-pp2-1f1b``."""
        split = f"-tp{self.tensor_parallel}{'-fsdp' if self.fsdp else ''}" if self.tensor_parallel > 1 else ""
        split += self.pipeline.key if self.pipeline else ""
        return f"{self.workload.name}-{self.device}-{self.processes}{split}"

    @property
    def data_parallel(self) -> int:
        """Processes that train on different samples (a tensor-parallel group and a pipeline share their batch)."""
        return self.processes // self.tensor_parallel // (self.pipeline.stages if self.pipeline else 1)

    @property
    def title(self) -> str:
        """What the table calls it."""
        where = "1 GPU, bf16-mixed" if self.device == "gpu" else f"CPU, {self.processes} process"
        if self.pipeline is not None:
            where += f"es ({self.pipeline.title})"
        elif self.device == "cpu" and self.tensor_parallel > 1:
            tp = f"TP {self.tensor_parallel}"
            where += f"es ({f'FSDP {self.data_parallel} x {tp}' if self.fsdp else tp}, gloo)"
        elif self.device == "cpu" and self.processes > 1:
            where += "es (DDP, gloo)"
        return f"{self.workload.title}, {where}"


SMALL = Workload("small", "MLP 64-256(BN)-256-10, batch 32", hidden=256, batch_size=32, steps=1500, warmup=150)
# Four processes share two cores here, so each step takes ~10x longer: fewer steps, the same network and batch.
SMALL_4 = replace(SMALL, steps=600, warmup=60, max_processes=4)
MID = Workload("mid", "MLP 64-1024(BN)-1024-10, batch 256", hidden=1024, batch_size=256, steps=200, warmup=30)
# Quick mode: the same code paths in seconds (the test suite runs it); its timings mean nothing.
QUICK_SMALL = replace(SMALL, steps=60, warmup=10)
GPU = replace(MID, name="gpu", steps=600, warmup=100, max_processes=1)


#: ``--startup``: the small MLP on 1, 2 and 4 processes, few steps: command to first step is what is measured.
STARTUP = replace(SMALL, name="startup", steps=120, warmup=20, max_processes=4)


def rows(quick: bool, gpu: bool, ablate: bool = False, startup: bool = False) -> list[Row]:
    """The throughput rows of a run (a layer's options pick its own rows instead: ``bench/tasks.py``).

    Args:
        quick: The seconds-long code-path check.
        gpu: One GPU is there: add the GPU row.
        ablate: Also run the template without the callbacks that act on every step, and once with its
            per-step hooks timed.
        startup: Only the start-up rows (1, 2 and 4 processes, raw, plain and template, few steps).
    """
    if startup:
        return [Row(STARTUP, n, variants=("raw", "plain", "template")) for n in (1, 2, 4)]
    if ablate:
        return ablated(rows(quick, gpu))
    if quick:
        return [
            Row(QUICK_SMALL, 1, variants=("raw", "plain", "template")),
            Row(QUICK_SMALL, 2, variants=("raw", "template")),
            *default_rows(quick, gpu),  # the layers' rows of the bench's own run (the regression)
        ]
    found = [Row(SMALL, 1), Row(SMALL, 2), Row(SMALL_4, 4), Row(MID, 1), *default_rows(quick, gpu)]
    if gpu:
        found.append(Row(GPU, 1, "gpu"))
    return found


def ablated(found: list[Row]) -> list[Row]:
    """``--ablate``: each row also run as the template without its per-step callbacks, and with its hooks timed."""
    return [replace(row, variants=(*row.variants, "lean", "hooks")) for row in found]


#: The throughput targets, per row key: the template's steps/s over each named way's, at least.
TARGETS: dict[str, dict[str, float]] = {
    "small-cpu-1": {"floor": 0.95, "plain": 1.1},
    # Several processes: the floor keeps Lightning's per-step SIGTERM broadcast, which the template's stop replaces.
    "small-cpu-2": {"floor": 1.1, "plain": 1.1},
    "small-cpu-4": {"floor": 1.1},
    "mid-cpu-1": {"floor": 0.95, "raw": 0.95},
}
#: Time to the first step may exceed the raw script's by at most this many seconds.
STARTUP_SLACK_S = 2.0
