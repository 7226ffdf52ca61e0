"""The sharding layer: model-parallel strategies, sharded checkpoints, and ``python -m project consolidate``.

Its rows join the core's tables (the scenarios ``fsdp`` and ``zero1``; the strategies fsdp, tensor_parallel,
pipeline and zero1), its subsections join ``parallel`` (``fsdp``, ``tensor_parallel``, ``pipeline_parallel``), its
degree rules decide the layout's ``tp`` and ``pp``, and its sharded folders are a checkpoint format of the core's.
"""

from project.commands import Builds, Command
from project.layers import Layer

_PLAN = "project.extras.sharding.plan"

LAYER = Layer(
    name="sharding",
    adds="fsdp, zero1, tensor and pipeline parallelism, sharded checkpoints and `consolidate`",
    commands=(
        Command(
            "consolidate",
            "merge a sharded (fsdp) checkpoint folder into one plain file (CKPT_DIR [--out FILE])",
            Builds.FILES,
            runner="project.extras.sharding.consolidate:consolidate",
        ),
    ),
    scenarios=(f"{_PLAN}.rows:scenarios",),
    strategies=(f"{_PLAN}.rows:strategies",),
    parallel=(f"{_PLAN}.config:subsections",),
    degrees=(f"{_PLAN}.degrees:with_degrees",),
    plan_notes=(f"{_PLAN}.notes:sharding_notes",),
    plan_report=(f"{_PLAN}.report:report",),
    checkpoint_formats=("project.extras.sharding.checkpoints.format:ShardedFormat",),
)
