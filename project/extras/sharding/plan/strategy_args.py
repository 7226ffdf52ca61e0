"""The arguments ``plan`` shows for the layer's strategies (a row's ``args``), from the ``parallel`` section.

JSON-ready, under the seed's names; the in-rank builders (a row's ``build``) take them as they are.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from project.plan.strategies import ddp_args

if TYPE_CHECKING:
    from project.plan.config import ParallelConfig

#: ``parallel.fsdp.sharding`` -> ``fully_shard``'s ``reshard_after_forward``.
RESHARD_AFTER_FORWARD = {"full": True, "grad_op": False, "hybrid": True}
DEFAULT_WRAP_RULE = "the outermost modules whose class occurs more than once in the network (default_wrap_classes)"


def fsdp_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
    """FSDP's arguments: the ``parallel.fsdp`` subsection, what the plan derives from it, and a 2-D plan's styles."""
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


def tensor_parallel_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
    """Tensor parallelism's arguments over every process (its checkpoints are sharded, as fsdp's)."""
    return {
        "tensor_parallel_plan": _tensor_plan(config),
        "checkpoint": "sharded (torch.distributed.checkpoint folder)",
        "fsdp": {"async_save": config.fsdp.async_save},
        "timeout_s": config.timeout_s,
    }


def pipeline_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
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


def zero1_args(config: ParallelConfig, start_method: str) -> dict[str, Any]:
    """DDP's arguments, and where the optimizer state lives."""
    return {
        **ddp_args(config, start_method),
        "optimizer_state": "sharded over the data-parallel ranks (ZeroRedundancyOptimizer)",
        "checkpoint": "one file (the optimizer state consolidated on rank 0 when saving)",
    }
