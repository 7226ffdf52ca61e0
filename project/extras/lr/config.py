"""The layer's subsection of the ``parallel`` section: ``learning_rate``.

A plain dataclass that imports nothing of the core: :mod:`project.plan.config` adds it to ``ParallelConfig`` as a
typed field while it is being imported (the layer's ``parallel`` hook, :func:`subsections`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

LrScaling = Literal["none", "linear", "sqrt"]


@dataclass
class LearningRate:
    """The ``parallel.learning_rate`` subsection: learning rates scaled with the global batch, and warmed up.

    Args:
        lr_scaling: none | linear | sqrt: multiply the optimizer's learning rates by
            ``global_batch_size / reference_batch_size`` (or its square root), so the same config trains
            alike with another global batch.
        reference_batch_size: The global batch the learning rate was tuned for (needed by ``lr_scaling``).
        warmup_steps: Optimizer steps over which the learning rate rises linearly to its (scaled) value.
    """

    lr_scaling: LrScaling = "none"
    reference_batch_size: int | None = None
    warmup_steps: int = 0
    moved_from_flat = True  # not a field: the options were flat once (parallel.lr_scaling -> learning_rate.lr_scaling)

    @property
    def active(self) -> bool:
        """Whether the optimizers' rates change at all (a scaling or a warmup is asked)."""
        return self.lr_scaling != "none" or self.warmup_steps > 0


def subsections() -> dict[str, Any]:
    """The layer's ``parallel`` hook: its subsection by field name."""
    return {"learning_rate": LearningRate}
