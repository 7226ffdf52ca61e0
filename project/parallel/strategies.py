"""The Trainer's strategy built from the plan's row, inside the ranks (the table itself is pure: ``project.plan``).

A row names its builder by import path (``module:function``); the builder gets the arguments the plan shows, the
process-group backend and the layout's degrees. Callbacks, checkpoints and export ask :func:`row_of` what the
running strategy does instead of sniffing its wrappers.
"""

from __future__ import annotations

import inspect
from datetime import timedelta
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from project.dotted import import_object
from project.plan.resolve import Plan
from project.plan.strategies import STRATEGIES, StrategyRow

#: The row of a run whose strategy is not the template's (``parallel: null``), by its Lightning class (the first
#: match in its class's method resolution order); any other strategy shards nothing.
LIGHTNING_ROWS = {"ModelParallelStrategy": "fsdp", "DDPStrategy": "ddp", "SingleDeviceStrategy": "single_device"}
UNSHARDED = STRATEGIES["ddp"]
#: The attribute a strategy built from a row carries its row name in.
ROW_ATTRIBUTE = "project_strategy_row"


def ddp_buffer_kwargs(broadcast_buffers: bool) -> dict[str, bool]:
    """The seed's ``broadcast_buffers`` under the name the installed torch uses.

    torch 2.13 deprecates ``broadcast_buffers`` (FutureWarning) for ``forward_sync_buffers``, which
    keeps the per-forward meaning; buffers are still synced once at start-up, when every rank holds
    the same freshly initialised values anyway.
    """
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    name = "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"
    return {name: broadcast_buffers}


def build_auto(args: dict[str, Any], backend: str | None, degrees: dict[str, int]) -> Any:
    """One process: Lightning picks the single-device strategy for the accelerator and device given."""
    return "auto"


def ddp_kwargs(args: dict[str, Any], backend: str | None) -> dict[str, Any]:
    """Lightning ``DDPStrategy`` keyword arguments from the plan's DDP arguments."""
    kwargs = dict(args)
    kwargs.update(ddp_buffer_kwargs(kwargs.pop("broadcast_buffers")))
    return {
        "process_group_backend": backend,
        "timeout": timedelta(seconds=kwargs.pop("timeout_s")),
        "start_method": kwargs.pop("start_method"),
        **kwargs,
    }


def build_ddp(args: dict[str, Any], backend: str | None, degrees: dict[str, int]) -> Any:
    """Lightning's ``DDPStrategy`` (data parallel over every process)."""
    from lightning.pytorch.strategies import DDPStrategy

    return DDPStrategy(**ddp_kwargs(args, backend))


def build_strategy(plan: Plan) -> Any:
    """The Trainer's ``strategy`` for ``plan``, from its row's builder.

    For a launcher Lightning does not detect, the strategy gets the cluster environment that reads its ranks.
    """
    strategy = import_object(plan.row.build)(plan.strategy_args, plan.backend, plan.degrees)
    if not isinstance(strategy, str):
        setattr(strategy, ROW_ATTRIBUTE, plan.strategy)
        if plan.cluster_environment is not None:
            strategy.cluster_environment = import_object(plan.cluster_environment)()
    return strategy


def trainer_kwargs(plan: Plan) -> dict[str, Any]:
    """Keyword arguments for ``lightning.Trainer`` (they replace accelerator/devices/strategy/...)."""
    return {
        "accelerator": plan.accelerator,
        "devices": plan.devices,
        "num_nodes": plan.num_nodes,
        "strategy": build_strategy(plan),
        "sync_batchnorm": plan.sync_batchnorm,
        "accumulate_grad_batches": plan.loader_batches[1],
        "precision": plan.precision,
    }


def row_of(strategy: Any) -> StrategyRow:
    """What the running strategy does: its row when the template built it, else the row of its Lightning class.

    A strategy given as ``trainer.strategy`` (``parallel: null``) that is Lightning's ``ModelParallelStrategy``
    shards like the ``fsdp`` row (its module's ``configure_model`` applies ``fully_shard``).
    """
    name = getattr(strategy, ROW_ATTRIBUTE, None)
    if name in STRATEGIES:
        return STRATEGIES[name]
    for cls in type(strategy).__mro__:
        if cls.__name__ in LIGHTNING_ROWS:
            return STRATEGIES[LIGHTNING_ROWS[cls.__name__]]
    return UNSHARDED


def built_from_plan(strategy: Any) -> bool:
    """Whether ``strategy`` was built from a row of the plan (the ``parallel`` section), not given by the user."""
    return getattr(strategy, ROW_ATTRIBUTE, None) in STRATEGIES
