"""The layer's rows of the core's tables: the ``fsdp`` and ``zero1`` scenarios, and four strategies.

Each function imports the core's row class when called: the core calls it at the end of that very module
(:mod:`project.plan.scenarios`, :mod:`project.plan.strategies`), once the class exists. A row names its code by
import path (its ``args`` for the plan, its ``build`` inside the ranks), imported only when used.
"""

from __future__ import annotations

from typing import Any

_ARGS = "project.extras.sharding.plan.strategy_args"


def scenarios() -> dict[str, Any]:
    """The scenarios ``fsdp`` and ``zero1`` (rows of :data:`project.plan.scenarios.SCENARIOS`)."""
    from project.plan.scenarios import Scenario

    return {
        # fsdp composes with tensor parallelism (2-D); FSDP-sharded pipeline stages are not built yet.
        "fsdp": Scenario("any", "fsdp", data_parallel="shard", composes=("tp",)),
        # DDP whose optimizer state is sharded over the ranks (ZeroRedundancyOptimizer): zero1.py.
        "zero1": Scenario("any", "zero1"),
    }


def strategies() -> dict[str, Any]:
    """The strategies fsdp, tensor_parallel, pipeline and zero1 (rows of :data:`project.plan.strategies.STRATEGIES`)."""
    from project.plan.strategies import StrategyRow

    return {
        # FSDP2 (fully_shard) applied by the template to any LightningModule: fsdp/strategy.py. A user's own
        # Lightning ModelParallelStrategy (trainer.strategy, parallel: null) shards alike.
        "fsdp": StrategyRow(
            args=f"{_ARGS}:fsdp_args",
            build="project.extras.sharding.fsdp.strategy:build",
            shards_parameters=True,
            shards_optimizer_state=True,
            checkpoint="sharded",
            grads_are_dtensors=True,
            memory="fsdp",
            lightning_class="ModelParallelStrategy",
        ),
        # Tensor parallelism over every process (tensor_parallel.py): each Linear of the plan split column- or
        # row-wise into DTensor shards; the data is the same on every rank.
        "tensor_parallel": StrategyRow(
            args=f"{_ARGS}:tensor_parallel_args",
            build="project.extras.sharding.fsdp.strategy:build_tensor_parallel",
            shards_parameters=True,
            checkpoint="sharded",
            grads_are_dtensors=True,
            degree="tp",
        ),
        # Pipeline parallelism (pipeline/): the network cut into stages, each stage's ranks sending activations
        # forward and gradients back on torch.distributed.pipelining's schedule; each stage's replicas over its
        # data-parallel ranks average their gradients as DDP does.
        "pipeline": StrategyRow(
            args=f"{_ARGS}:pipeline_args",
            build="project.extras.sharding.pipeline:build",
            shards_parameters=True,
            checkpoint="file",
            stages=True,
            degree="pp",
        ),
        # ZeRO stage 1: DDP whose optimizer state is sharded over the ranks (zero1.py); the parameters and
        # gradients stay replicated, so export and the finiteness check are DDP's.
        "zero1": StrategyRow(
            args=f"{_ARGS}:zero1_args",
            build="project.extras.sharding.zero1:build",
            shards_optimizer_state=True,
            checkpoint="file",
            memory="zero1",
        ),
    }
