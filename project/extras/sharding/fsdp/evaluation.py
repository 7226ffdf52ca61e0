"""Evaluation under FSDP on uneven shards: the parameters gathered once for the whole evaluation, not per forward.

FSDP gathers each unit's parameters at every forward, a collective that every rank must join; exactly-once
shards can give ranks different numbers of batches, and the rank with more would wait forever. Then the
parameters are gathered once for the whole evaluation (the full model's memory, as under DDP) and freed after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from project.extras.sharding.fsdp.sharding import fsdp_modules
from project.extras.sharding.plan.strategy_args import RESHARD_AFTER_FORWARD

if TYPE_CHECKING:
    import lightning as L


def evaluation_batches(trainer: L.Trainer) -> list[float]:
    """This rank's batch count of each loader of the evaluation running now (test, predict, sanity check, val)."""
    if trainer.testing:
        return list(trainer.num_test_batches)
    if trainer.predicting:
        return list(trainer.num_predict_batches)
    if trainer.sanity_checking:
        return list(trainer.num_sanity_val_batches)
    return list(trainer.num_val_batches)


def gather_if_uneven(module: nn.Module, mine: list[float], world_size: int, device: torch.device) -> list[Any] | None:
    """Gather every FSDP unit of ``module`` for the evaluation if the ranks' batch counts differ (every rank).

    Args:
        module: The sharded LightningModule.
        mine: This rank's batch count per loader (:func:`evaluation_batches`); every rank has the same loaders.
        world_size: The ranks that all-gather their counts.
        device: The process group's device.

    Returns:
        The units now gathered (kept so until :func:`reshard_after_evaluation`), or ``None`` when the counts
        are equal and finite on every rank (FSDP's per-forward gathers are then safe).
    """
    counts = torch.tensor([float(n) for n in mine], dtype=torch.float64, device=device)
    everyone = [torch.zeros_like(counts) for _ in range(world_size)]
    dist.all_gather(everyone, counts)
    if all(torch.equal(c, everyone[0]) for c in everyone) and torch.isfinite(counts).all():
        return None
    units = fsdp_modules(module)
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    return units


def reshard_after_evaluation(units: list[Any], module: nn.Module | None, sharding: str) -> None:
    """Free the parameters :func:`gather_if_uneven` gathered, and give each unit FSDP's resharding back."""
    roots = {id(child) for child in module.children()} if module else set()
    for unit in units:
        unit.reshard()
        # FSDP2's own choice back: a root keeps its parameters from forward to backward (they would be
        # gathered again at once), the other units as the sharding says.
        again = RESHARD_AFTER_FORWARD[sharding] and id(unit) not in roots
        unit.set_reshard_after_forward(again, recurse=False)
