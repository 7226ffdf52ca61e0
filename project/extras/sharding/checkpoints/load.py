"""A checkpoint loaded into a sharded (FSDP) module and its optimizers, on every rank (collectives).

A sharded checkpoint is read with DCP, each rank reading its part of every tensor whatever world size wrote it; an
ordinary (full) checkpoint is held whole by every rank, which keeps its shard of each tensor. Either way a
parameter that the checkpoint holds no optimizer state for (it never got a gradient) has none after the load.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import CheckpointException

from project.checkpoints.loading import safe_load
from project.errors import UserError
from project.extras.sharding.checkpoints import (
    LIGHTNING_META,
    OPTIMIZER,
    WEIGHTS,
    SafeLoadPlanner,
    SafeReader,
    read_metadata,
)
from project.extras.sharding.checkpoints.errors import LOAD_ERRORS, causes, misfit_error, unsafe_error

#: The DCP step whose failure means the state to load does not fit the checkpoint (a key or a shape it lacks).
_PLAN_STEP = "plan"


def _key_parents(keys: Iterable[str]) -> set[str]:
    """Every dotted prefix of every key: ``a.b.c`` -> ``a``, ``a.b``."""
    parents: set[str] = set()
    for key in keys:
        end = key.find(".")
        while end != -1:
            parents.add(key[:end])
            end = key.find(".", end + 1)
    return parents


def _saved_state_only(optimizer_state: dict[str, Any], key: str, saved: Iterable[str]) -> dict[str, Any]:
    """An optimizer state dict (keyed by parameter names) without the parameters the checkpoint holds no state for.

    An optimizer has state only for the parameters it has updated: one that never got a gradient (a head that
    ``forward`` does not use, a branch not taken yet) has none in the checkpoint, and must have none after the
    load either, as in the run that wrote it. ``get_optimizer_state_dict`` of a fresh optimizer makes state up
    for every parameter (one step with zero gradients), which DCP would then look for in the checkpoint.

    Args:
        optimizer_state: ``get_optimizer_state_dict``'s ``{"state": {name: {...}}, "param_groups": [...]}``.
        key: The optimizer's key in the checkpoint (``optimizer_0``).
        saved: The checkpoint's keys (DCP's flattened ``optimizer_0.state.<name>.<field>``).
    """
    parents = _key_parents(saved)
    state = optimizer_state.get("state", {})
    kept = {name: value for name, value in state.items() if f"{key}.state.{name}" in parents}
    return {**optimizer_state, "state": kept}


def load_sharded_into(
    path: Path, module: nn.Module, optimizers: Sequence[torch.optim.Optimizer], strict: bool = True
) -> dict[str, Any]:
    """Load a sharded checkpoint into a sharded ``module`` and its ``optimizers`` (every rank: collectives).

    DCP reads each rank's part of every tensor, whatever world size wrote the checkpoint. A parameter that the
    checkpoint holds no optimizer state for (it never got a gradient) has none after the load. Returns ``meta.pt``.

    Raises:
        UserError: refused by the pickle policy, damaged, or not the checkpoint of this model and optimizers.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    saved = read_metadata(path).state_dict_metadata.keys()  # the pickle policy first, in one line
    weights = {WEIGHTS: get_model_state_dict(module)}
    _dcp_load(path, weights)
    try:
        set_model_state_dict(module, weights[WEIGHTS], options=StateDictOptions(strict=strict))
    except Exception as error:
        raise misfit_error(path, error) from error
    for i, optimizer in enumerate(optimizers):
        key = OPTIMIZER.format(i)
        state = {key: _saved_state_only(get_optimizer_state_dict(module, optimizer), key, saved)}
        _dcp_load(path, state)
        try:
            # Not strict: the parameters left without state are exactly those the checkpoint has none for.
            set_optimizer_state_dict(module, optimizer, state[key], options=StateDictOptions(strict=False))
        except Exception as error:
            raise misfit_error(path, error) from error
    return safe_load(path / LIGHTNING_META)


def _by_name(optimizer_state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer state keyed by position (``Optimizer.state_dict``) keyed by the parameters' ``names`` instead."""
    if all(isinstance(key, str) for key in optimizer_state.get("state", {})):
        return optimizer_state  # keyed by name already
    groups = optimizer_state.get("param_groups", [])
    positions = [i for group in groups for i in group["params"]]
    if sorted(positions) != list(range(len(names))):
        raise ValueError(f"the checkpoint's optimizer has {len(positions)} parameters, this one {len(names)}")
    return {
        "state": {names[i]: value for i, value in optimizer_state.get("state", {}).items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in groups],
    }


def load_full_into(
    path: Path,
    checkpoint: dict[str, Any],
    module: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    strict: bool = True,
) -> None:
    """Load an ordinary (full) Lightning checkpoint into a sharded ``module`` and its ``optimizers`` (every rank).

    Every rank holds the whole ``checkpoint`` (read from ``path``) and keeps its shard of each tensor. Its optimizer
    states are keyed by position, as DDP, one process and ``consolidate`` write them; a parameter that one holds no
    state for (it never got a gradient) has none after the load, as in the run that wrote it.

    Raises:
        UserError: the checkpoint's weights or optimizer state are not those of this model and optimizers.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    try:
        set_model_state_dict(module, checkpoint[WEIGHTS], options=StateDictOptions(full_state_dict=True, strict=strict))
        for optimizer, saved in zip(optimizers, checkpoint.get("optimizer_states", [])):
            # The names in the optimizer's order, as torch's state-dict functions spell them.
            template = get_optimizer_state_dict(module, optimizer)
            names = [name for group in template["param_groups"] for name in group["params"]]
            state = _by_name(saved, names)
            # Not strict: the parameters without state are dropped below, as in the checkpoint.
            options = StateDictOptions(full_state_dict=True, strict=False)
            set_optimizer_state_dict(module, optimizer, state, options=options)
            params = [param for group in optimizer.param_groups for param in group["params"]]
            for name, param in zip(names, params):
                if name not in state["state"]:
                    # torch gave every parameter of a fresh optimizer state (a step with zero gradients).
                    optimizer.state.pop(param, None)
    except Exception as error:
        raise misfit_error(path, error) from error


def _dcp_load(path: Path, state: dict[str, Any]) -> None:
    """DCP's load of ``state``'s keys from ``path`` (every rank), read safely; every failure is one line."""
    try:
        dcp.load(state, storage_reader=SafeReader(path), planner=SafeLoadPlanner())
    except LOAD_ERRORS as error:
        # DCP plans the load from the index (read before, so readable) before it reads a byte: a failure there
        # is a key or a shape of this model or optimizer that the checkpoint lacks, not damage.
        planning = isinstance(error, CheckpointException) and error.args[:1] == (_PLAN_STEP,)
        refused = any(isinstance(e, (UserError, pickle.UnpicklingError)) for e in causes(error))
        raise (misfit_error(path, error) if planning and not refused else unsafe_error(path, error)) from error
