"""Pipeline parallelism (``parallel.pipeline_parallel``).

The network cut into stages over ``torch.distributed.pipelining`` (:mod:`.strategy`), the cut (:mod:`.split`),
the module's contract (:mod:`.contract`), the schedule and the forward through the stages (:mod:`.schedule`), and
checkpoints that are one process's (:mod:`.checkpoint`).
Which units each stage holds is pure: :mod:`project.extras.sharding.plan.pipeline_plan`.
"""

from project.extras.sharding.pipeline.strategy import PipelineStrategy, build

__all__ = ["PipelineStrategy", "build"]
