"""Per-rank interval timing without a host sync: the host clock on CPU, CUDA events on a GPU.

The step-time probes (the check's, the straggler detection's) sum the time of marked intervals on each rank with
:class:`IntervalTimer` and gather the sums once per window, never per step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class IntervalTimer:
    """Sums the time of marked intervals on this rank: host clock on CPU, CUDA events on a GPU.

    CUDA events are recorded in stream order and only read when a window is gathered, long after the
    kernels ran, so reading them never stalls the step.
    """

    cuda: bool = False
    _start: Any = None
    _pending: list[tuple[Any, Any]] = field(default_factory=list)
    _seconds: float = 0.0
    intervals: int = 0

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        """Open an interval (a no-op while one is open)."""
        if self._start is None:
            self._start = self._now()

    def stop(self) -> None:
        """Close the open interval, if any, and add it to the sum."""
        if self._start is None:
            return
        end = self._now()
        if self.cuda:
            self._pending.append((self._start, end))
        else:
            self._seconds += end - self._start
        self._start = None
        self.intervals += 1

    def cancel(self) -> None:
        """Drop the open interval (an epoch boundary: the loader's start-up is not a step)."""
        self._start = None

    def take(self) -> float:
        """The seconds summed since the last take (the window's), and start a new window."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self._seconds += sum(a.elapsed_time(b) for a, b in self._pending) / 1000.0
            self._pending.clear()
        seconds, self._seconds = self._seconds, 0.0
        return seconds
