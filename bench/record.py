"""What every measured run writes: step times, the final loss and a weights checksum, as one JSON file.

Imports nothing but the standard library at module level, so the raw script's start-up stays raw.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Where a run writes its record (set by the harness; unset means "do not record").
OUT_ENV = "BENCH_RECORD"
#: Steps left out of the throughput by the Lightning runs' timer (set by the harness).
WARMUP_ENV = "BENCH_WARMUP"


#: Steps per throughput window: a multiple of the period of every per-step cost the template has by default (the
#: non-finite check every 10 steps, logging and the straggler gather every 50), so every window holds its share.
WINDOW_STEPS = 50


class StepClock:
    """Timestamps of the end of every optimizer step, plus the wall time of the first one.

    Args:
        warmup: Steps excluded from the throughput (the windows run from step ``warmup`` to the last).
        steps: Steps the run makes.
        sync: Called before the timestamps that bound the windows (``torch.cuda.synchronize`` on a GPU, so
            that queued kernels count where they ran); ``None`` on the CPU.
    """

    def __init__(self, warmup: int, steps: int, sync: Callable[[], Any] | None = None) -> None:
        self.warmup = warmup
        self.steps = steps
        self.sync = sync
        self.times: list[float] = []
        self.first_step_wall: float | None = None

    def tick(self) -> None:
        """Call once after each optimizer step."""
        done = len(self.times)
        if (
            self.sync is not None
            and done >= self.warmup
            and ((done - self.warmup) % WINDOW_STEPS == 0 or done == self.steps - 1)
        ):
            self.sync()
        self.times.append(time.perf_counter())
        if self.first_step_wall is None:
            self.first_step_wall = time.time()

    def _check(self) -> None:
        if len(self.times) <= self.warmup + 1:
            raise RuntimeError(f"only {len(self.times)} steps ran; need more than warmup={self.warmup} + 1")

    def run_steps_per_s(self) -> float:
        """Steps per second between the end of step ``warmup`` and the end of the last step."""
        self._check()
        return (len(self.times) - 1 - self.warmup) / (self.times[-1] - self.times[self.warmup])

    def steps_per_s(self) -> float:
        """The median over consecutive windows of :data:`WINDOW_STEPS` steps after the warm-up of their steps/s.

        A shared machine has slow spells of a few seconds (other tenants); the median of the windows keeps
        one of them from deciding a run, and every per-step cost with a period up to the window's still
        counts. With fewer steps than one window: :meth:`run_steps_per_s`.
        """
        self._check()
        bounds = self.times[self.warmup :: WINDOW_STEPS]
        rates = [WINDOW_STEPS / (b - a) for a, b in itertools.pairwise(bounds)]
        return statistics.median(rates) if rates else self.run_steps_per_s()

    def record(self, loss: float, checksum: float, **extra: Any) -> dict[str, Any]:
        """The run's record: steps, throughput (windows' median and whole run), first-step wall time, loss, checksum."""
        return {
            "steps": len(self.times),
            "warmup": self.warmup,
            "steps_per_s": self.steps_per_s(),
            "run_steps_per_s": self.run_steps_per_s(),
            "first_step_wall": self.first_step_wall,
            "final_loss": loss,
            "checksum": checksum,
            **extra,
        }


def weights_checksum(module: Any) -> float:
    """Sum of every parameter in float64: equal weights give equal sums, to float tolerance.

    A sharded parameter (a DTensor) is gathered whole first: every rank must call this then.
    """
    whole = (p.full_tensor() if hasattr(p, "full_tensor") else p for p in module.parameters())
    return float(sum(p.detach().double().sum() for p in whole))


def write_record(record: dict[str, Any], path: str | None = None) -> None:
    """Write ``record`` as JSON to ``path`` (default: ``$BENCH_RECORD``; nothing when unset)."""
    target = path or os.environ.get(OUT_ENV)
    if not target:
        return
    tmp = Path(f"{target}.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(target)
