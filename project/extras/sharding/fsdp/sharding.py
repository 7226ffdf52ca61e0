"""Sharding a LightningModule's networks in place with ``fully_shard``, and the collectives around sharded tensors.

The networks are sharded bottom-up (each unit of :mod:`project.extras.sharding.fsdp.units`, then each network) after
every rank took rank 0's weights, as DDP does when it wraps (the verdict on sharded tensors being finite is the
guards layer's, which reads the strategy row's ``grads_are_dtensors`` and ``shards_parameters``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from project.extras.sharding.fsdp.units import (
    has_parameters,
    refuse_ties_across_networks,
    sharded_roots,
    tied_groups,
    tied_outside,
)
from project.extras.sharding.plan.strategy_args import RESHARD_AFTER_FORWARD
from project.parallel.collectives import process_group_size

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def is_sharded(module: nn.Module) -> bool:
    """Whether ``fully_shard`` or tensor parallelism was applied to ``module`` (a submodule, a parameter)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    return any(isinstance(m, FSDPModule) for m in module.modules()) or any(
        isinstance(p, DTensor) for p in module.parameters()
    )


def fsdp_modules(module: nn.Module) -> list[Any]:
    """The FSDP units inside ``module``."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def shard_module(
    module: nn.Module,
    mesh: DeviceMesh,
    sharding: str,
    cpu_offload: bool,
    wrap_classes: list[type],
) -> None:
    """Apply ``fully_shard`` to each unit of ``module``'s networks (innermost first), then to each network."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": RESHARD_AFTER_FORWARD[sharding],
        # Pinned host memory needs CUDA; on CPU processes the offload is a no-op anyway.
        "offload_policy": CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy(),
    }
    classes = tuple(wrap_classes)
    roots = [root for _, root in sharded_roots(module)]
    refuse_ties_across_networks(module)
    # A network reached under two names (`self.net = nn.Sequential(self.backbone, self.head)`) is one unit, sharded
    # once: fully_shard refuses a module it was already applied to.
    done: set[int] = set()
    for group in tied_groups(roots):
        for root in group:
            # Reversed pre-order puts every module after its descendants: fully_shard goes bottom-up. A module whose
            # weight is tied to one outside it stays in its network's group.
            for sub in reversed(list(root.modules())):
                unit = sub is not root and isinstance(sub, classes) and has_parameters(sub)
                if unit and id(sub) not in done and not tied_outside(sub, roots):
                    fully_shard(sub, **kwargs)
                    done.add(id(sub))
        # The outermost network of the group (one inside another is sharded with it).
        inner = {id(m) for root in group for m in root.modules() if m is not root}
        for root in (root for root in group if id(root) not in inner and id(root) not in done):
            fully_shard(root, **kwargs)
        done.update(id(root) for root in group)


def point_optimizers_at(
    optimizers: Iterable[torch.optim.Optimizer], before: dict[str, nn.Parameter], now: dict[str, nn.Parameter]
) -> None:
    """Point ``optimizers``, built over the parameters ``before`` sharding, at the sharded ones ``now`` (by name).

    ``fully_shard`` replaced each parameter with a sharded one of the same name; an optimizer's state for a
    parameter moves with it.
    """
    live = {id(p) for p in now.values()}
    names = {id(p): name for name, p in before.items()}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for i, param in enumerate(group["params"]):
                if id(param) not in live and id(param) in names:
                    group["params"][i] = now[names[id(param)]]
                    if param in optimizer.state:
                        optimizer.state[group["params"][i]] = optimizer.state.pop(param)


def broadcast_from_rank0(module: nn.Module, device: torch.device) -> None:
    """Give every rank rank 0's parameters and buffers before sharding, as DDP does when it wraps.

    A tensor that is not on the process group's ``device`` (CPU weights under nccl) goes through a copy there,
    one tensor at a time, so no rank ever holds the whole model on the device.
    """
    if process_group_size() == 1:
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.device.type == "meta":
                continue
            if tensor.device == device:
                dist.broadcast(tensor, src=0)
            else:
                staged = tensor.detach().to(device)
                dist.broadcast(staged, src=0)
                tensor.copy_(staged)
