"""``parallel.scenario: zero1``: DDP whose optimizer state is sharded over the data-parallel ranks (ZeRO stage 1).

Parameters and gradients are replicated as under DDP (the gradients all-reduced in the backward); each rank keeps
the optimizer state of its own partition of the parameters only, updates that partition, and broadcasts it to
the others (``torch.distributed.optim.ZeroRedundancyOptimizer``). Any ``torch.optim.Optimizer`` the config
names works unchanged: :class:`ZeroOneStrategy` builds it as Lightning does, then wraps it.

Checkpoints stay single files: Lightning's ``Strategy.optimizer_state`` calls ``consolidate_state_dict()`` on
every rank (a collective) and keeps the full state on rank 0, which writes it; loading hands every rank the full
state and ZeRO keeps its partition. So a zero1 checkpoint resumes on any number of processes, with or without
zero1, and a DDP checkpoint resumes under zero1.
"""

from __future__ import annotations

import inspect
from typing import Any
from weakref import ref

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.optim import ZeroRedundancyOptimizer

from project.errors import UserError
from project.extras.sharding.lightning_private import chained_schedulers, mark_scheduler_steps
from project.parallel.ddp import ddp_kwargs
from project.plan.layout import Layout

#: Arguments the plan shows that describe the strategy rather than configure Lightning's DDPStrategy.
SHOWN_ONLY = ("optimizer_state", "checkpoint")


def _constructor_defaults(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's defaults its own class accepts back as keyword arguments.

    ``defaults`` may hold keys the constructor sets itself (AdamW's ``decoupled_weight_decay``), which the class
    refuses as arguments; the param groups carry every key anyway, so only the accepted ones are passed.
    """
    params = inspect.signature(type(optimizer).__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(optimizer.defaults)
    return {key: value for key, value in optimizer.defaults.items() if key in params}


def _refuse(optimizer: Any) -> None:
    """One line for an optimizer ZeRO cannot shard here."""
    name = type(optimizer).__name__
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(
            f"optimizer {name} is not a torch.optim.Optimizer; parallel.scenario zero1 shards the state of "
            "torch.optim optimizers only (ZeroRedundancyOptimizer); use one, or scenario ddp"
        )
    if isinstance(optimizer, torch.optim.LBFGS):
        # LBFGS evaluates the closure (forward and backward) until its own partition's gradients and losses say
        # stop: the ranks would run different numbers of DDP backwards and fall out of step in the all-reduce.
        raise UserError(
            "optimizer LBFGS re-evaluates the loss a different number of times on each rank under parallel."
            "scenario zero1 (each rank steps its own partition); use scenario ddp for LBFGS"
        )


def shard_optimizer_state(optimizer: Any) -> ZeroRedundancyOptimizer:
    """``optimizer`` (built, not stepped yet) as a ``ZeroRedundancyOptimizer`` of its class, groups and defaults.

    Raises:
        UserError: not a ``torch.optim.Optimizer``, LBFGS, or a class whose constructor ZeRO cannot call.
    """
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer  # the module built its own
    _refuse(optimizer)
    # Each group with its own hyperparameters (lr, weight decay, a scheduler's initial_lr); param_names would
    # describe all of a group's parameters while ZeRO hands each rank a part of them.
    groups = [
        {**{k: v for k, v in group.items() if k != "param_names"}, "params": list(group["params"])}
        for group in optimizer.param_groups
    ]
    try:
        return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **_constructor_defaults(optimizer))
    except TypeError as error:
        raise UserError(
            f"optimizer {type(optimizer).__name__} cannot be rebuilt on a partition of the parameters under "
            f"parallel.scenario zero1 ({error}); its constructor must take (params, **defaults), or use scenario ddp"
        ) from error


def _track_steps(optimizer: torch.optim.Optimizer) -> None:
    """Mark each step of ``optimizer`` as an ``LRScheduler`` does to the optimizer it is built on.

    The scheduler was built on the optimizer ZeRO replaced; without the mark it warns at its first step that
    ``optimizer.step()`` was overridden.
    """
    optimizer.step = mark_scheduler_steps(ref(optimizer), optimizer.step)  # type: ignore[method-assign]


def _repoint(scheduler: Any, replaced: dict[int, ZeroRedundancyOptimizer]) -> None:
    """Point ``scheduler`` (and those it chains: SequentialLR, ChainedScheduler) at the optimizer's replacement."""
    new = replaced.get(id(getattr(scheduler, "optimizer", None)))
    if new is not None:
        scheduler.optimizer = new
        _track_steps(new)
    for child in chained_schedulers(scheduler):
        _repoint(child, replaced)


class ZeroOneStrategy(DDPStrategy):
    """Lightning's ``DDPStrategy`` whose optimizers are ``ZeroRedundancyOptimizer``: ZeRO stage 1.

    Lightning builds the optimizers and schedulers from the module as under DDP (after the DDP wrap); each
    optimizer is then replaced by a ``ZeroRedundancyOptimizer`` of its class over the same param groups, and
    each scheduler re-pointed to it. Saving and loading need nothing here (see the module doc).
    """

    def setup_optimizers(self, trainer: L.Trainer) -> None:
        """Lightning's optimizers and schedulers, each optimizer's state sharded over the ranks."""
        super().setup_optimizers(trainer)
        built = self.optimizers  # kept alive to the end: the mapping below is by id
        sharded = [shard_optimizer_state(optimizer) for optimizer in built]
        replaced = {id(old): new for old, new in zip(built, sharded) if old is not new}
        self.optimizers = sharded  # the setter wraps them in LightningOptimizers again
        for config in self.lr_scheduler_configs:
            _repoint(config.scheduler, replaced)


def build(args: dict[str, Any], backend: str | None, layout: Layout) -> ZeroOneStrategy:
    """The row's builder: :class:`ZeroOneStrategy` with the plan's DDP arguments.

    ZeRO shards over the default process group, every rank: the zero1 layout is data parallel only.
    """
    ddp = {key: value for key, value in args.items() if key not in SHOWN_ONLY}
    return ZeroOneStrategy(**ddp_kwargs(ddp, backend))
