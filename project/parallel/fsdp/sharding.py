"""Sharding a LightningModule's networks in place with ``fully_shard``, and the collectives around sharded tensors.

The networks are sharded bottom-up (each unit of :mod:`project.parallel.fsdp.units`, then each network) after
every rank took rank 0's weights, as DDP does when it wraps; :func:`sharded_finite` gives every rank the same
verdict on tensors each rank holds a shard of.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from project.parallel.collectives import in_process_group, process_group_size
from project.parallel.fsdp.units import has_parameters, sharded_roots
from project.plan.strategies import RESHARD_AFTER_FORWARD

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
    # A network reached under two names (`self.net = nn.Sequential(self.backbone, self.head)`) is one unit, sharded
    # once: fully_shard refuses a module it was already applied to.
    done: set[int] = set()
    for _, root in sharded_roots(module):
        # Reversed pre-order puts every module after its descendants: fully_shard goes bottom-up.
        for sub in reversed(list(root.modules())):
            if (sub is root or (isinstance(sub, classes) and has_parameters(sub))) and id(sub) not in done:
                fully_shard(sub, **kwargs)
                done.add(id(sub))


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


def sharded_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether sharded (FSDP) tensors (gradients, parameters) are finite on every rank.

    Each rank holds its shard, so a nan may sit in one rank's shard only: each rank checks its own and the
    verdicts are all-reduced (one one-element collective), so all ranks agree.
    """
    from torch.distributed.tensor import DTensor

    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    norm = torch.nn.utils.get_total_norm(local, norm_type=2.0, foreach=True)
    bad = (~torch.isfinite(norm)).float().reshape(1)
    if in_process_group():
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return not bool(bad.item())
