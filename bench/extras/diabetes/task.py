"""The regression MLP as a bench task: its network, data and config for every way (raw, plain, template).

The task ``regression`` of ``bench/tasks.py``. No Lightning here, so ``bench/raw.py`` stays raw. Every way reads the
same synthetic tensors (``data.py`` beside this file is the template's plain datamodule over them).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

if TYPE_CHECKING:
    from bench.workloads import Row, Workload

TASK = "regression"
BASE_CONFIG = "configs/diabetes/diabetes.yaml"
DATA_CLASS = "bench.extras.diabetes.data.SyntheticRegression"


def net_args(workload: Workload) -> dict[str, Any]:
    """``project.models.mlp.MLP``'s init_args: the workload's width, one target, two hidden layers."""
    return {"in_features": workload.in_features, "hidden": workload.hidden, "out_features": 1, "depth": 2}


def data_args(workload: Workload) -> dict[str, Any]:
    """The synthetic datamodule's init_args."""
    return {
        "num_samples": workload.num_samples,
        "in_features": workload.in_features,
        "batch_size": workload.batch_size,
        "eval_fraction": workload.eval_fraction,
        "seed": workload.data_seed,
    }


def model_config(workload: Workload) -> dict[str, Any]:
    """The ``model`` section: ``Regressor`` around the workload's MLP."""
    net = {"class_path": "project.models.mlp.MLP", "init_args": net_args(workload)}
    return {"class_path": "project.extras.diabetes.regressor.Regressor", "init_args": {"model": net}}


def network(hidden: int, block_size: int, in_features: int) -> tuple[torch.nn.Module, Any]:
    """The MLP and its loss (MSE against one target), as ``Regressor`` computes it."""
    from project.models.mlp import MLP

    return MLP(in_features, hidden, out_features=1, depth=2), lambda out, y: F.mse_loss(out.squeeze(-1), y)


def training_set(data: dict[str, torch.Tensor], block_size: int) -> tuple[Any, Any]:
    """The training tensors of the harness's file (``{"x", "y"}``), default collation."""
    return TensorDataset(data["x"], data["y"]), None


def workload() -> Workload:
    """The regression row's workload: a 16-256-256-1 MLP, batch 32, on one process."""
    from bench.workloads import Workload

    return Workload(
        "reg", "regression MLP 16-256-256-1 (MSE), batch 32", hidden=256, batch_size=32, steps=1500, warmup=150,
        in_features=16, max_processes=1, task=TASK,
    )  # fmt: skip


def default_rows(quick: bool, gpu: bool) -> list[Row]:
    """The rows joining the bench's own run: the regression on one process (quick: raw and the template only)."""
    from bench.workloads import Row

    if quick:
        return [Row(replace(workload(), steps=60, warmup=10), 1, variants=("raw", "template"))]
    return [Row(workload(), 1)]
