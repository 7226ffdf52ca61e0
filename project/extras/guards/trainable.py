"""Parameters whose ``requires_grad`` changes during fit, all-reduced under DDP after the change.

DDP's reducer all-reduces the gradients of the parameters that were trainable when it was built, and no others:
a backbone a fine-tuning callback unfreezes later trains on each rank's own gradients, and the replicas drift
apart without an error. When the trainable set changes, the DDP wrapper is built again around the same module
(Lightning's public ``configure_ddp``), once; the steps after it cost what they cost before. A change made after
a step's forward has run (in ``on_after_backward``, say) is caught before that step's optimizer step: the newly
trainable parameters' gradients are averaged over the ranks by one all-reduce, then DDP is rebuilt.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def trainable_mask(module: nn.Module) -> tuple[bool, ...]:
    """``requires_grad`` of each of ``module``'s parameters, in order (a few microseconds per hundred)."""
    return tuple(param.requires_grad for param in module.parameters())


def trainable_names(module: nn.Module) -> list[str]:
    """The names of ``module``'s trainable parameters."""
    return [name for name, param in module.named_parameters() if param.requires_grad]


def ddp_of(strategy: Any) -> DistributedDataParallel | None:
    """The DDP wrapper the strategy trains through, if any."""
    model = getattr(strategy, "model", None)
    return model if isinstance(model, DistributedDataParallel) else None


def average_gradients(params: list[nn.Parameter], ddp: DistributedDataParallel) -> None:
    """Average the gradients of ``params`` over DDP's process group, as its reducer would have (one all-reduce)."""
    grads = [param.grad for param in params if param.grad is not None]
    if not grads:
        return
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    dist.all_reduce(flat, group=ddp.process_group)
    flat /= dist.get_world_size(ddp.process_group)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def rebuild_ddp(strategy: Any) -> None:
    """Wrap the strategy's LightningModule in a new DDP, which reduces the parameters trainable now.

    The old wrapper is dropped first: its reducer's gradient hooks go with it, so no gradient is reduced twice.
    """
    old = ddp_of(strategy)
    if old is None:
        return
    module = old.module
    strategy.model = module
    del old
    strategy.configure_ddp()
