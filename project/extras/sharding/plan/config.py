"""The layer's subsections of the ``parallel`` section: ``fsdp``, ``tensor_parallel``, ``pipeline_parallel``.

Plain dataclasses that import nothing of the core: :mod:`project.plan.config` adds them to ``ParallelConfig`` as
typed fields while it is being imported (a layer's ``parallel`` hook, :func:`subsections`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Sharding = Literal["full", "grad_op", "hybrid"]
#: A tensor-parallel style for the modules a plan pattern matches (torch.distributed.tensor.parallel's styles);
#: ``sequence`` is refused with its reason (project.extras.sharding.plan.tensor_plan).
TensorStyle = Literal["colwise", "rowwise", "sequence"]
PipelineSchedule = Literal["1f1b", "gpipe"]


@dataclass
class TensorParallel:
    """The ``parallel.tensor_parallel`` subsection (docs/extras/sharding.md, "Tensor parallelism").

    Args:
        size: Processes that split each layer's weights between them (the innermost degree: the ``size``
            consecutive ranks of a group share their data). 1: off.
        plan: ``auto`` (the template's GPT, and Linear pairs with only element-wise modules between them), or a
            mapping from module-name patterns (``fnmatch``, e.g. ``"blocks.*.mlp.up"``) to ``colwise`` or
            ``rowwise`` (``sequence`` is refused). A module with a ``parallelize(mesh)`` method parallelizes
            itself.
    """

    size: int = 1
    plan: str | dict[str, TensorStyle] = "auto"


@dataclass
class PipelineParallel:
    """The ``parallel.pipeline_parallel`` subsection (docs/extras/sharding.md, "Pipeline parallelism").

    Args:
        size: Pipeline stages: consecutive slices of the network, one per group of processes, each sending its
            activations to the next (the outermost degree). 1: off.
        schedule: ``1f1b`` (one forward, one backward: at most ``size`` micro-batches' activations held) or
            ``gpipe`` (every forward, then every backward), torch.distributed.pipelining's schedules.
        microbatches: Micro-batches each process's batch is cut into for the pipeline; ``None``: ``size``.
        split_points: Names of the modules each stage after the first begins with (``["blocks.2"]``);
            ``None``: the module's own ``pipeline_split_points(stages)``, or its repeated blocks split evenly.
    """

    size: int = 1
    schedule: PipelineSchedule = "1f1b"
    microbatches: int | None = None
    split_points: list[str] | None = None


@dataclass
class FsdpOptions:
    """The ``parallel.fsdp`` subsection: how ``fully_shard`` shards, and how sharded checkpoints are written.

    Args:
        sharding: full (parameters, gradients and optimizer state sharded) | grad_op (gradients and optimizer
            state only) | hybrid (full within a node, replicated across nodes). Scenario fsdp only, as are
            ``cpu_offload`` and ``wrap_modules``.
        cpu_offload: Keep the sharded parameters and optimizer state in CPU memory.
        wrap_modules: Class names (``Linear``) or import paths of the modules sharded as one unit each;
            ``None`` shards the model's largest child modules as the plan shows.
        async_save: Sharded checkpoints (fsdp, and tensor-parallel runs, which the same strategy builds): copy the
            state in memory and write it in the background, at most one save in flight (training goes on while the
            disk works); false: every rank waits for its write.
    """

    sharding: Sharding = "full"
    cpu_offload: bool = False
    wrap_modules: list[str] | None = None
    async_save: bool = True
    moved_from_flat = True  # not a field: the options were flat once (parallel.sharding -> parallel.fsdp.sharding)


def subsections() -> dict[str, Any]:
    """The subsections this layer adds to ``parallel``, by field name (in the order ``--help`` lists them)."""
    return {"fsdp": FsdpOptions, "tensor_parallel": TensorParallel, "pipeline_parallel": PipelineParallel}
