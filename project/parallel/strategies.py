"""The table from scenario to Lightning strategy and its arguments: a new strategy is a row, not a branch.

Each row says which arguments the plan shows (``args``, JSON-ready, under the seed's names) and how the
Trainer's strategy is built from them (``build``). One process always runs ``single_device``.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from project.parallel.config import ParallelConfig


@dataclass(frozen=True)
class StrategyRow:
    """One Lightning strategy: the plan's view of its arguments and how to build it."""

    #: The arguments ``plan`` and ``plan.json`` show, from the ``parallel`` section and the launch.
    args: Callable[[ParallelConfig, str], dict[str, Any]]
    #: The Trainer's ``strategy`` from those arguments and the process-group backend.
    build: Callable[[dict[str, Any], str | None], Any]


def ddp_buffer_kwargs(broadcast_buffers: bool) -> dict[str, bool]:
    """The seed's ``broadcast_buffers`` under the name the installed torch uses.

    torch 2.13 deprecates ``broadcast_buffers`` (FutureWarning) for ``forward_sync_buffers``, which
    keeps the per-forward meaning; buffers are still synced once at start-up, when every rank holds
    the same freshly initialised values anyway.
    """
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    name = "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"
    return {name: broadcast_buffers}


def is_interactive() -> bool:
    """A notebook or REPL, where processes must be forked (Lightning's own rule)."""
    return hasattr(sys, "ps1") or bool(sys.flags.interactive) or "ipykernel" in sys.modules


def _ddp_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
    return {
        "find_unused_parameters": config.find_unused_parameters,
        # The seed's name; build passes it under the installed torch's name.
        "broadcast_buffers": config.broadcast_buffers,
        "timeout_s": config.timeout_s,
        "start_method": start_method,
    }


def _build_ddp(args: dict[str, Any], backend: str | None) -> Any:
    from lightning.pytorch.strategies import DDPStrategy

    kwargs = dict(args)
    kwargs.update(ddp_buffer_kwargs(kwargs.pop("broadcast_buffers")))
    return DDPStrategy(
        process_group_backend=backend,
        timeout=timedelta(seconds=kwargs.pop("timeout_s")),
        start_method=kwargs.pop("start_method"),
        **kwargs,
    )


def _fsdp_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
    from project.parallel.fsdp import DEFAULT_WRAP_RULE, RESHARD_AFTER_FORWARD

    return {
        "sharding": config.sharding,
        "reshard_after_forward": RESHARD_AFTER_FORWARD[config.sharding],
        "cpu_offload": config.cpu_offload,
        "wrap_modules": list(config.wrap_modules) if config.wrap_modules is not None else None,
        "wrap_rule": "parallel.wrap_modules" if config.wrap_modules is not None else DEFAULT_WRAP_RULE,
        "checkpoint": "sharded (torch.distributed.checkpoint folder)",
        "timeout_s": config.timeout_s,
    }


def _build_fsdp(args: dict[str, Any], backend: str | None) -> Any:
    from project.parallel.fsdp import FSDPStrategy

    return FSDPStrategy(
        sharding=args["sharding"],
        cpu_offload=args["cpu_offload"],
        wrap_modules=args["wrap_modules"],
        process_group_backend=backend,
        timeout=timedelta(seconds=args["timeout_s"]),
    )


STRATEGIES: dict[str, StrategyRow] = {
    # One process: Lightning picks the single-device strategy for the accelerator and device given.
    "single_device": StrategyRow(args=lambda config, start_method: {}, build=lambda args, backend: "auto"),
    "ddp": StrategyRow(args=_ddp_args, build=_build_ddp),
    # DDP whose ranks are forked from this process (Lightning's ddp_notebook): what Jupyter needs.
    "ddp_fork": StrategyRow(args=lambda config, start_method: _ddp_args(config, "fork"), build=_build_ddp),
    # FSDP2 (fully_shard) applied by the template to any LightningModule: project/parallel/fsdp.py.
    "fsdp": StrategyRow(args=_fsdp_args, build=_build_fsdp),
}
#: The strategy of each scenario on more than one process (dp runs as DDP: Lightning removed DataParallel).
SCENARIO_STRATEGY = {
    "cpu": "ddp",
    "single": "single_device",
    "dp": "ddp",
    "ddp": "ddp",
    "fork": "ddp_fork",
    "fsdp": "fsdp",
}


def strategy_name(scenario: str, world_size: int) -> str:
    """The table's strategy for ``scenario`` at ``world_size`` processes."""
    return "single_device" if world_size == 1 else SCENARIO_STRATEGY[scenario]
