"""The sharding layer: model-parallel strategies, sharded checkpoints, and ``python -m project consolidate``."""

from project.commands import Builds, Command
from project.layers import Layer

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
)
