"""The character-level GPT as a bench task: its network, data and config for every way (raw, plain, template).

The task ``chargpt`` of ``bench/tasks.py``. No Lightning here, so ``bench/raw.py`` stays raw. The raw and plain ways
read the template's own training text (``project.extras.gpt.chargpt``'s first 90 %, encoded, written once by the
harness) as the same windows (``project.extras.gpt.chartext.TextWindows``) in the same order
(``GlobalBatchSampler``), so all ways do equal work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from bench.workloads import Workload

TASK = "chargpt"
BASE_CONFIG = "configs/gpt/chargpt.yaml"
DATA_CLASS = "project.extras.gpt.chargpt.CharTextDataModule"
#: The raw pipelining loop of the rows cut into stages (``python -m bench --pipeline``).
RAW_PIPELINE = "bench/extras/gpt/raw_pipeline.py"
#: The reference point's shape (configs/gpt/chargpt.yaml); the workload's ``hidden`` is the width.
N_LAYER = 4
N_HEAD = 4


def net_args(workload: Workload) -> dict[str, Any]:
    """The GPT's init_args: the reference's depth and heads, the workload's width and block, no dropout."""
    return {
        "block_size": workload.block_size,
        "n_layer": N_LAYER,
        "n_head": N_HEAD,
        "n_embd": workload.hidden,
        "dropout": 0.0,
    }


def data_args(workload: Workload) -> dict[str, Any]:
    """The datamodule's init_args: the workload's windows and batch, a small validation set (the sanity check)."""
    batch = {"batch_size": workload.batch_size, "seed": workload.data_seed}
    return {"block_size": workload.block_size, "val_windows": 8, **batch}


def model_config(workload: Workload) -> dict[str, Any]:
    """The ``model`` section: ``LanguageModel`` around the workload's GPT."""
    net = {"class_path": "project.extras.gpt.gpt.GPT", "init_args": net_args(workload)}
    return {"class_path": "project.extras.gpt.language_model.LanguageModel", "init_args": {"net": net}}


def network(hidden: int, block_size: int, in_features: int = 0) -> tuple[torch.nn.Module, Any]:
    """The GPT and its loss (mean cross-entropy per token), as ``LanguageModel`` computes it (no ``in_features``)."""
    from project.extras.gpt.gpt import GPT

    net = GPT(block_size=block_size, n_layer=N_LAYER, n_head=N_HEAD, n_embd=hidden, dropout=0.0)

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return net, loss_fn


def collated(batch: list[torch.Tensor]) -> list[torch.Tensor]:
    """The windows' ``collate_fn``: a batch comes out of ``TextWindows.__getitems__`` collated already.

    ``project.data.base.collated`` does the same, but that module imports Lightning.
    """
    return batch


def training_set(data: dict[str, torch.Tensor], block_size: int) -> tuple[Any, Any]:
    """The training windows of the harness's file (``{"tokens"}``) and their ``collate_fn``."""
    from project.extras.gpt.chartext import TextWindows

    return TextWindows(data["tokens"], block_size), collated
