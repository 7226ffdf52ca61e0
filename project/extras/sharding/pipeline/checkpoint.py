"""A pipeline's checkpoint is one process's checkpoint: the stages' state dicts and optimizer states gathered.

Each stage holds a subset of the whole model's parameters under their own names (FQNs), so the model state is the
union of the stages' state dicts, and each optimizer's state is put back under the indices one process's optimizer
gives them (the order of the whole network's parameters in its groups, recorded before the cut). The file resumes
as one process, as DDP, as FSDP (which reads a full state dict) and as any other (dp, pp); ``consolidate`` has
nothing to merge. Every stage gathers over its pipeline's group; rank 0 writes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from project.extras.sharding.pipeline.schedule import Pipeline


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    return value


def gather_over(where: Pipeline, value: Any) -> list[Any]:
    """``value`` of each stage of this rank's pipeline, in stage order."""
    gathered: list[Any] = [None] * where.stages
    dist.all_gather_object(gathered, value, group=where.group)
    return gathered


def whole_state_dict(module: nn.Module, where: Pipeline) -> dict[str, Any]:
    """The whole model's state dict (CPU tensors), from every stage's part."""
    merged: dict[str, Any] = {}
    for part in gather_over(where, _to_cpu(module.state_dict())):
        merged.update(part)
    return merged


def group_names(optimizer: Any, module: nn.Module) -> list[list[str]]:
    """The FQNs of each parameter group's parameters, in the optimizer's order."""
    name_of = {id(parameter): name for name, parameter in module.named_parameters(remove_duplicate=False)}
    return [[name_of[id(parameter)] for parameter in group["params"]] for group in optimizer.param_groups]


def whole_optimizer_state(optimizer: Any, module: nn.Module, whole: list[list[str]], where: Pipeline) -> dict:
    """``optimizer``'s state as one process's optimizer over the whole network would hold it.

    Args:
        optimizer: This stage's optimizer (its groups hold this stage's parameters only).
        module: The LightningModule (the names of this stage's parameters).
        whole: :func:`group_names` of the optimizer over the whole network, before the cut.
        where: This rank's pipeline.
    """
    state = optimizer.state_dict()
    mine = [name for names in group_names(optimizer, module) for name in names]
    by_name: dict[str, Any] = {}
    for part in gather_over(where, {mine[index]: _to_cpu(value) for index, value in state["state"].items()}):
        by_name.update(part)
    index_of = {name: index for index, name in enumerate(name for names in whole for name in names)}
    groups, start = [], 0
    for group, names in zip(state["param_groups"], whole):
        groups.append({**group, "params": list(range(start, start + len(names)))})
        start += len(names)
    return {"state": {index_of[name]: value for name, value in by_name.items()}, "param_groups": groups}


def stage_optimizer_state(saved: dict, optimizer: Any, module: nn.Module, whole: list[list[str]]) -> dict:
    """One process's optimizer state ``saved`` cut to this stage's parameters, under the stage's indices."""
    flat = [name for names in whole for name in names]
    mine = [name for names in group_names(optimizer, module) for name in names]
    position = {name: index for index, name in enumerate(mine)}
    state = {position[flat[index]]: value for index, value in saved["state"].items() if flat[index] in position}
    groups, start = [], 0
    for group, names in zip(saved["param_groups"], group_names(optimizer, module)):
        groups.append({**group, "params": list(range(start, start + len(names)))})
        start += len(names)
    return {"state": state, "param_groups": groups}
