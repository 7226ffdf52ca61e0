"""A sharded checkpoint merged into an ordinary Lightning checkpoint in one process (no process group).

How one process (or DDP) resumes a sharded checkpoint, what ``python -m project consolidate`` writes, and where an
export reads a sharded run's weights. DCP reads every shard of every tensor through the safe reader of
:mod:`project.extras.sharding.checkpoints`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

# dcp_to_torch_save's loader: the public way to read a DCP folder into one process without process group
# (torch has no public name for it).
from project.checkpoints.loading import load_lightning_checkpoint, safe_load
from project.errors import UserError
from project.extras.sharding.checkpoints import (
    DCP_METADATA,
    LIGHTNING_META,
    OPTIMIZER,
    WEIGHTS,
    SafeEmptyPlanner,
    SafeReader,
    is_sharded_checkpoint,
    read_metadata,
)
from project.extras.sharding.checkpoints.errors import LOAD_ERRORS, unsafe_error
from project.extras.sharding.lightning_private import load_without_process_group


def _by_position(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter names (DCP) keyed by position again, as ``Optimizer.state_dict``."""
    groups = optimizer_state.get("param_groups", [])
    position = {name: i for i, name in enumerate(n for group in groups for n in group["params"])}
    return {
        "state": {position[name]: value for name, value in optimizer_state.get("state", {}).items()},
        "param_groups": [{**group, "params": [position[n] for n in group["params"]]} for group in groups],
    }


def load_full_checkpoint(path: str | os.PathLike[str], weights_only: bool = False) -> dict[str, Any]:
    """A sharded checkpoint merged in this process into an ordinary Lightning checkpoint (no process group).

    Args:
        path: The checkpoint folder.
        weights_only: Merge the weights only (export, ``consolidate --weights_only``): no optimizer state.

    Raises:
        UserError: not a complete sharded checkpoint, or one that holds more than weights-only objects.
    """
    folder = Path(path)
    if not is_sharded_checkpoint(folder):
        raise UserError(
            f"'{folder}' is not a sharded checkpoint (a folder with {DCP_METADATA} and {LIGHTNING_META}, written by "
            "scenario fsdp); give the folder itself, e.g. logs/<name>/version_<n>/checkpoints/last.ckpt"
        )
    meta = safe_load(folder / LIGHTNING_META)
    read_metadata(folder)  # refused here in one line: DCP would fold the refusal into an AssertionError's text
    keys = [WEIGHTS] if weights_only else None
    merged: dict[str, Any] = {}
    try:
        load_without_process_group(merged, SafeReader(folder), SafeEmptyPlanner(keys=keys))
    except LOAD_ERRORS as error:
        raise unsafe_error(folder, error) from error
    optimizers = [merged[OPTIMIZER.format(i)] for i in range(len(merged)) if OPTIMIZER.format(i) in merged]
    checkpoint = {**meta, WEIGHTS: merged.get(WEIGHTS, {})}
    if not weights_only:
        checkpoint["optimizer_states"] = [_by_position(state) for state in optimizers]
    return checkpoint


def checkpoint_weights(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of a Lightning checkpoint: a file, or a sharded folder merged here (weights only)."""
    if is_sharded_checkpoint(path):
        return load_full_checkpoint(path, weights_only=True)[WEIGHTS]
    return load_lightning_checkpoint(path)[WEIGHTS]
