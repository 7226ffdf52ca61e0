"""The model-parallel degrees asked for (tensor, pipeline), checked against the scenario and the world size.

A scenario's row says which degrees it composes with (:attr:`project.plan.scenarios.Scenario.composes`) and how
its data-parallel degree is made (replicas or shards); what is left of the world after the model-parallel degrees
is the data-parallel degree. Every rule is one line with the bad value and the fix.
"""

from __future__ import annotations

from dataclasses import replace

from project.errors import UserError
from project.plan.config import ParallelConfig
from project.plan.layout import Layout
from project.plan.scenarios import SCENARIOS


def _composing(degree: str) -> str:
    """The scenarios a degree composes with, for messages."""
    return ", ".join(repr(name) for name, row in SCENARIOS.items() if degree in row.composes)


#: What messages call each degree.
_WORDS = {"tp": "tensor parallelism", "pp": "pipeline parallelism"}


def _checked(option: str, size: int, degree: str, scenario: str, world_size: int) -> int:
    """A degree's size: at least 1, a composing scenario, a divisor of the world size."""
    if size < 1:
        raise UserError(f"parallel.{option}={size} must be >= 1 (1: off)")
    if size == 1:
        return 1
    if degree not in SCENARIOS[scenario].composes:
        raise UserError(
            f"parallel.{option}={size} with scenario {scenario!r}: {_WORDS[degree]} runs with scenario "
            f"{_composing(degree)}; "
            "change the scenario or set size 1"
        )
    if world_size % size:
        raise UserError(
            f"parallel.{option}={size} does not divide the world size {world_size}; use a divisor of "
            f"{world_size} or change parallel.devices / num_nodes"
        )
    return size


def tensor_degree(config: ParallelConfig, scenario: str, world_size: int) -> int:
    """``parallel.tensor_parallel.size``, checked against the scenario and the world size.

    Raises:
        UserError: a size below 1, one that does not divide the world size, a scenario it does not compose with,
            a pipeline beside it, or data parallelism beside it where the scenario replicates (2-D is FSDP x TP).
    """
    tp = _checked("tensor_parallel.size", config.tensor_parallel.size, "tp", scenario, world_size)
    if tp == 1:
        return 1
    pp = config.pipeline_parallel.size
    if pp > 1:
        raise UserError(
            f"parallel.pipeline_parallel.size={pp} with parallel.tensor_parallel.size={tp}: pipeline and tensor "
            "parallelism do not run together here yet; set one of them to 1"
        )
    sharded = SCENARIOS[scenario].data_parallel == "shard"
    if sharded and config.fsdp.sharding == "hybrid":
        raise UserError(
            f"parallel.tensor_parallel.size={tp} with parallel.fsdp.sharding 'hybrid': 2-D runs with sharding "
            "'full' or 'grad_op'; change parallel.fsdp.sharding"
        )
    if not sharded and world_size != tp:
        raise UserError(
            f"parallel.tensor_parallel.size={tp} on {world_size} processes leaves {world_size // tp} data-parallel "
            f"groups, which scenario {scenario!r} cannot combine with tensor parallelism; use scenario 'fsdp' "
            f"(2-D: FSDP x TP) or parallel.tensor_parallel.size {world_size}"
        )
    return tp


def pipeline_degree(config: ParallelConfig, scenario: str, world_size: int) -> int:
    """``parallel.pipeline_parallel.size``, checked against the scenario, the world size and the other degrees.

    Raises:
        UserError: a size below 1 or not dividing the world size, a scenario it does not compose with, or a
            schedule with too few micro-batches.
    """
    section = config.pipeline_parallel
    pp = _checked("pipeline_parallel.size", section.size, "pp", scenario, world_size)
    if pp == 1:
        return 1
    micro = section.microbatches
    if micro is not None and micro < 1:
        raise UserError(f"parallel.pipeline_parallel.microbatches={micro} must be >= 1 (None: one per stage)")
    if section.schedule == "1f1b" and micro is not None and micro < pp:
        raise UserError(
            f"parallel.pipeline_parallel.microbatches={micro} is fewer than the {pp} stages, which schedule '1f1b' "
            f"needs to fill the pipeline; use microbatches >= {pp} or schedule 'gpipe'"
        )
    return pp


def with_degrees(config: ParallelConfig, layout: Layout) -> Layout:
    """The layer's ``degrees`` hook: ``layout`` (data parallel over every process) with its tensor and pipeline degrees.

    What the model-parallel degrees leave is the data-parallel degree: replicas, or shards (over every process, or
    within a node and replicated across the nodes under ``fsdp.sharding: hybrid``).

    Raises:
        UserError: as :func:`tensor_degree` and :func:`pipeline_degree`.
    """
    scenario, world_size = layout.scenario, layout.world_size
    tp = tensor_degree(config, scenario, world_size)
    pp = pipeline_degree(config, scenario, world_size)
    data_parallel = world_size // (tp * pp)
    if SCENARIOS[scenario].data_parallel == "replicate":
        return replace(layout, dp_replicate=data_parallel, dp_shard=1, tp=tp, pp=pp)
    replicas = layout.num_nodes if config.fsdp.sharding == "hybrid" else 1
    return replace(layout, dp_replicate=replicas, dp_shard=data_parallel // replicas, tp=tp, pp=pp)
