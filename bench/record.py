"""What every measured run writes: step times, the final loss and a weights checksum, as one JSON file.

Imports nothing but the standard library at module level, so the raw script's start-up stays raw.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Where a run writes its record (set by the harness; unset means "do not record").
OUT_ENV = "BENCH_RECORD"
#: Steps left out of the throughput by the Lightning runs' timer (set by the harness).
WARMUP_ENV = "BENCH_WARMUP"


class StepClock:
    """Timestamps of the end of every optimizer step, plus the wall time of the first one.

    Args:
        warmup: Steps excluded from the throughput (the window runs from step ``warmup`` to the last).
        steps: Steps the run makes.
        sync: Called before the two timestamps that bound the window (``torch.cuda.synchronize`` on a
            GPU, so that queued kernels count where they ran); ``None`` on the CPU.
    """

    def __init__(self, warmup: int, steps: int, sync: Callable[[], Any] | None = None) -> None:
        self.warmup = warmup
        self.steps = steps
        self.sync = sync
        self.times: list[float] = []
        self.first_step_wall: float | None = None

    def tick(self) -> None:
        """Call once after each optimizer step."""
        if self.sync is not None and len(self.times) in (self.warmup, self.steps - 1):
            self.sync()
        self.times.append(time.perf_counter())
        if self.first_step_wall is None:
            self.first_step_wall = time.time()

    def steps_per_s(self) -> float:
        """Steps per second between the end of step ``warmup`` and the end of the last step."""
        if len(self.times) <= self.warmup + 1:
            raise RuntimeError(f"only {len(self.times)} steps ran; need more than warmup={self.warmup} + 1")
        return (len(self.times) - 1 - self.warmup) / (self.times[-1] - self.times[self.warmup])

    def record(self, loss: float, checksum: float, **extra: Any) -> dict[str, Any]:
        """The run's record: steps, throughput, first-step wall time, final loss and weights checksum."""
        return {
            "steps": len(self.times),
            "warmup": self.warmup,
            "steps_per_s": self.steps_per_s(),
            "first_step_wall": self.first_step_wall,
            "final_loss": loss,
            "checksum": checksum,
            **extra,
        }


def weights_checksum(module: Any) -> float:
    """Sum of every parameter in float64: equal weights give equal sums, to float tolerance."""
    return float(sum(p.detach().double().sum() for p in module.parameters()))


def write_record(record: dict[str, Any], path: str | None = None) -> None:
    """Write ``record`` as JSON to ``path`` (default: ``$BENCH_RECORD``; nothing when unset)."""
    target = path or os.environ.get(OUT_ENV)
    if not target:
        return
    tmp = Path(f"{target}.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(target)
