"""The table from scenario to strategy: a new strategy is a row, not a branch.

Each row names the arguments the plan shows (``args``), the in-rank code that builds the Trainer's strategy
(``build``, an import path: this module imports nothing of Lightning), and what the strategy does, so that callbacks,
checkpoints and export ask the row instead of sniffing wrappers and tensor types.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import Any, Literal

from project.plan.config import ParallelConfig
from project.plan.layout import Layout
from project.plan.scenarios import SCENARIOS


@dataclass(frozen=True)
class StrategyRow:
    """One strategy: the plan's view of its arguments, where it is built, and its capabilities."""

    #: ``module:function`` ``(config, start_method) -> dict``: the arguments ``plan`` and ``plan.json`` show.
    args: str
    #: ``module:function`` of the in-rank builder ``(args, backend, layout) -> Trainer strategy``.
    build: str
    #: Each rank holds a shard of the parameters (and so of the gradients): gather before a full export.
    shards_parameters: bool = False
    #: Each rank holds a shard of the optimizer state (consolidated on save where ``checkpoint`` is "file").
    shards_optimizer_state: bool = False
    #: A checkpoint is one file, or a folder of per-rank shards (``consolidate`` merges it).
    checkpoint: Literal["file", "sharded"] = "file"
    #: Gradients are DTensors (each rank its shard): a finiteness check all-reduces the ranks' verdicts.
    grads_are_dtensors: bool = False
    #: Each rank holds one pipeline stage: the whole model comes from the strategy's ``lightning_module_state_dict``.
    stages: bool = False
    #: What the strategy does with memory: the column of ``plan``'s memory table it runs (ddp, or a layer's).
    memory: str = "ddp"
    #: The model-parallel degree (``tp``, ``pp``) that, above 1, picks this row under a replicating scenario.
    degree: str | None = None
    #: The Lightning strategy class (by name) that acts like this row as ``trainer.strategy`` (``parallel: null``).
    lightning_class: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The capabilities, JSON-ready, for ``plan.json``."""
        shown = ("shards_parameters", "shards_optimizer_state", "checkpoint", "grads_are_dtensors", "stages")
        return {name: getattr(self, name) for name in shown}


def is_interactive() -> bool:
    """A notebook or REPL, where processes must be forked (a running IPython shell; an imported IPython is not)."""
    if hasattr(sys, "ps1") or bool(sys.flags.interactive):
        return True
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    return callable(get_ipython) and get_ipython() is not None


def no_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
    """One process: nothing to show."""
    return {}


def ddp_fork_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
    """DDP's arguments with its ranks forked from this process."""
    return ddp_args(config, "fork")


def ddp_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
    """The DDP arguments the plan shows (the seed's names; the builder passes them under the installed torch's)."""
    return {"ddp": asdict(config.ddp), "timeout_s": config.timeout_s, "start_method": start_method}


#: What ``trainer.strategy`` holds when it asks for no particular strategy (one device, or Lightning's choice).
UNNAMED_STRATEGIES = (None, "auto", "single_device")

_DDP = "project.parallel.ddp:build_ddp"
#: The core's rows; each layer adds its own (a layer's ``strategies``: fsdp, zero1, tensor and pipeline parallelism).
CORE_STRATEGIES: dict[str, StrategyRow] = {
    # One process: Lightning picks the single-device strategy for the accelerator and device given.
    "single_device": StrategyRow(
        args="project.plan.strategies:no_args",
        build="project.parallel.strategies:build_auto",
        lightning_class="SingleDeviceStrategy",
    ),
    "ddp": StrategyRow(args="project.plan.strategies:ddp_args", build=_DDP, lightning_class="DDPStrategy"),
    # DDP whose ranks are forked from this process (Lightning's ddp_notebook): what Jupyter needs.
    "ddp_fork": StrategyRow(args="project.plan.strategies:ddp_fork_args", build=_DDP),
}
ONE_PROCESS = "single_device"
# At the end of the module: a layer's rows are StrategyRow instances, so its module imports this one first.
from project.layers import rows  # noqa: E402

#: Every strategy of this checkout: the core's, then each installed layer's.
STRATEGIES: dict[str, StrategyRow] = {**CORE_STRATEGIES, **rows("strategies")}


def strategy_name(layout: Layout) -> str:
    """The table's strategy for a layout: one process, a model-parallel degree's row, or the scenario's."""
    if layout.world_size == 1:
        return ONE_PROCESS
    if SCENARIOS[layout.scenario].data_parallel == "replicate":  # a sharding scenario builds the degrees itself
        for name, row in STRATEGIES.items():
            if row.degree is not None and layout.size(row.degree) > 1:
                return name
    return SCENARIOS[layout.scenario].strategy
