"""The table from scenario to strategy: a new strategy is a row, not a branch.

Each row says which arguments the plan shows (``args``, JSON-ready, under the seed's names), where the in-rank
code that builds the Trainer's strategy from them lives (``build``, an import path: this module is pure and
imports nothing of Lightning or of :mod:`project.parallel`), and what the strategy does, so that callbacks,
checkpoints and export ask the row instead of sniffing wrappers and tensor types. One process always runs
``single_device``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from project.plan.config import ParallelConfig
from project.plan.layout import Layout
from project.plan.scenarios import SCENARIOS

#: ``parallel.fsdp.sharding`` -> ``fully_shard``'s ``reshard_after_forward``.
RESHARD_AFTER_FORWARD = {"full": True, "grad_op": False, "hybrid": True}
DEFAULT_WRAP_RULE = "the outermost modules whose class occurs more than once in the network (default_wrap_classes)"


@dataclass(frozen=True)
class StrategyRow:
    """One strategy: the plan's view of its arguments, where it is built, and its capabilities."""

    #: The arguments ``plan`` and ``plan.json`` show, from the ``parallel`` section and the start method.
    args: Callable[[ParallelConfig, str], dict[str, Any]]
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
    #: Each rank holds one pipeline stage's layers: the strategy's ``lightning_module_state_dict`` gathers the
    #: whole model (export and checkpoints take it from there, never from a rank's own parameters).
    stages: bool = False
    #: What the plan says the strategy does with memory, for ``plan``'s memory table: ddp | zero1 | fsdp (a
    #: tensor-parallel degree divides the split layers first, in every column).
    memory: Literal["ddp", "zero1", "fsdp"] = "ddp"

    def to_dict(self) -> dict[str, Any]:
        """The capabilities, JSON-ready, for ``plan.json``."""
        return {
            "shards_parameters": self.shards_parameters,
            "shards_optimizer_state": self.shards_optimizer_state,
            "checkpoint": self.checkpoint,
            "grads_are_dtensors": self.grads_are_dtensors,
            "stages": self.stages,
        }


def is_interactive() -> bool:
    """A notebook or REPL, where processes must be forked: Lightning's rule, and a running IPython shell.

    Only a running shell counts: a process that merely imported ipykernel or IPython (a test runner executing
    notebooks, a tool built on them) is not interactive.
    """
    if hasattr(sys, "ps1") or bool(sys.flags.interactive):
        return True
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    return callable(get_ipython) and get_ipython() is not None


def ddp_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
    """The DDP arguments the plan shows (the seed's names; the builder passes them under the installed torch's)."""
    return {
        "ddp": asdict(config.ddp),
        "timeout_s": config.timeout_s,
        "start_method": start_method,
    }


def _fsdp_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
    fsdp = config.fsdp
    return {
        "fsdp": asdict(fsdp),  # the parallel.fsdp subsection as given
        "reshard_after_forward": RESHARD_AFTER_FORWARD[fsdp.sharding],
        "wrap_rule": "parallel.fsdp.wrap_modules" if fsdp.wrap_modules is not None else DEFAULT_WRAP_RULE,
        "checkpoint": "sharded (torch.distributed.checkpoint folder)",
        "timeout_s": config.timeout_s,
        **({"tensor_parallel_plan": _tensor_plan(config)} if config.tensor_parallel.size > 1 else {}),
    }


def _tensor_plan(config: ParallelConfig) -> str | dict[str, str]:
    """``parallel.tensor_parallel.plan``, JSON-ready: ``auto`` or the mapping of module patterns to styles."""
    plan = config.tensor_parallel.plan
    return dict(plan) if isinstance(plan, dict) else plan


def _tensor_parallel_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
    return {
        "tensor_parallel_plan": _tensor_plan(config),
        "checkpoint": "sharded (torch.distributed.checkpoint folder)",
        "fsdp": {"async_save": config.fsdp.async_save},
        "timeout_s": config.timeout_s,
    }


def _pipeline_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
    """The pipeline's arguments; each stage's data-parallel replicas average their gradients as DDP does."""
    section = config.pipeline_parallel
    return {
        "schedule": section.schedule,
        "microbatches": section.microbatches or section.size,
        "split_points": list(section.split_points) if section.split_points is not None else None,
        "data_parallel": "ddp",
        **ddp_args(config, start_method),
        "checkpoint": "one file (each stage's state gathered on rank 0 by parameter name)",
    }


def _zero1_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
    return {
        **ddp_args(config, start_method),
        "optimizer_state": "sharded over the data-parallel ranks (ZeroRedundancyOptimizer)",
        "checkpoint": "one file (the optimizer state consolidated on rank 0 when saving)",
    }


#: What ``trainer.strategy`` holds when it asks for no particular strategy (one device, or Lightning's choice).
UNNAMED_STRATEGIES = (None, "auto", "single_device")

_DDP = "project.parallel.ddp:build_ddp"
STRATEGIES: dict[str, StrategyRow] = {
    # One process: Lightning picks the single-device strategy for the accelerator and device given.
    "single_device": StrategyRow(args=lambda config, start_method: {}, build="project.parallel.strategies:build_auto"),
    "ddp": StrategyRow(args=ddp_args, build=_DDP),
    # DDP whose ranks are forked from this process (Lightning's ddp_notebook): what Jupyter needs.
    "ddp_fork": StrategyRow(args=lambda config, start_method: ddp_args(config, "fork"), build=_DDP),
    # FSDP2 (fully_shard) applied by the template to any LightningModule: project/parallel/fsdp/strategy.py.
    "fsdp": StrategyRow(
        args=_fsdp_args,
        build="project.parallel.fsdp.strategy:build",
        shards_parameters=True,
        shards_optimizer_state=True,
        checkpoint="sharded",
        grads_are_dtensors=True,
        memory="fsdp",
    ),
    # Tensor parallelism over every process (project/parallel/tensor_parallel.py): each Linear of the plan split
    # column- or row-wise into DTensor shards; the data is the same on every rank.
    "tensor_parallel": StrategyRow(
        args=_tensor_parallel_args,
        build="project.parallel.fsdp.strategy:build_tensor_parallel",
        shards_parameters=True,
        checkpoint="sharded",
        grads_are_dtensors=True,
    ),
    # Pipeline parallelism (project/parallel/pipeline/): the network cut into stages, each stage's ranks sending
    # activations forward and gradients back on torch.distributed.pipelining's schedule; each stage's replicas
    # over its data-parallel ranks average their gradients as DDP does.
    "pipeline": StrategyRow(
        args=_pipeline_args,
        build="project.parallel.pipeline:build",
        shards_parameters=True,
        checkpoint="file",
        stages=True,
    ),
    # ZeRO stage 1: DDP whose optimizer state is sharded over the ranks (project/parallel/zero1.py); the
    # parameters and gradients stay replicated, so export and the finiteness check are DDP's.
    "zero1": StrategyRow(
        args=_zero1_args,
        build="project.parallel.zero1:build",
        shards_optimizer_state=True,
        checkpoint="file",
        memory="zero1",
    ),
}


def strategy_name(layout: Layout) -> str:
    """The table's strategy for a layout: one process, a pipeline, tensor parallelism alone, or the scenario's."""
    if layout.world_size == 1:
        return "single_device"
    if layout.pp > 1:  # each stage replicated or sharded over its data-parallel ranks: the pipeline row builds both
        return "pipeline"
    if layout.tp > 1 and SCENARIOS[layout.scenario].data_parallel == "replicate":  # sharded + tp is fsdp's 2-D
        return "tensor_parallel"
    return SCENARIOS[layout.scenario].strategy
