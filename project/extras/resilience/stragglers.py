"""Straggler detection: each rank's own compute time, gathered every N steps, the slow rank named once.

Under DDP every rank waits for the slowest one in the gradient all-reduce, so a step *including* the
all-reduce takes the same time on every rank and hides who is slow. What tells them apart is the time
before it: from the end of the previous step (so the next batch's loading is included) to the start of
``backward`` (where the all-reduce of the last micro-batch happens). :class:`IntervalTimer` measures that on
each rank without a host sync (CUDA events on GPUs, ``perf_counter`` on CPU); :class:`StragglerCallback`
gathers the per-rank means every ``every_n_steps`` optimizer steps (one small all-gather per window,
none per step), logs ``ranks/step_s_max``, ``ranks/step_s_min``, ``ranks/step_s_median`` and
``ranks/slowest``, and names a rank that is ``factor`` times slower than the median of the *other* ranks
in ``patience`` windows in a row in one warning line (the first window, with its warm-up, never counts).
"""

from __future__ import annotations

import socket
import statistics
import sys
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from project.callbacks.finite import gather_ranks
from project.callbacks.interval_timer import IntervalTimer
from project.parallel.collectives import gather_objects


@dataclass(frozen=True)
class Window:
    """One gathered window: each rank's mean compute seconds per optimizer step over ``steps``."""

    first_step: int
    last_step: int
    step_s: tuple[float, ...]

    @property
    def slowest(self) -> int:
        """The rank with the largest mean."""
        return max(range(len(self.step_s)), key=self.step_s.__getitem__)

    def ratio(self, rank: int) -> float:
        """How many times the median of the other ranks ``rank`` takes (the median of all hides one of two)."""
        others = [s for r, s in enumerate(self.step_s) if r != rank]
        median = statistics.median(others) if others else self.step_s[rank]
        return self.step_s[rank] / median if median > 0 else float("inf")


class StragglerCallback(L.Callback):
    """Measure each rank's compute time before the gradient all-reduce and name a persistently slow rank.

    Args:
        every_n_steps: Optimizer steps per gathered window (one small all-gather each).
        factor: A rank whose mean is this many times the median of the others is slow in that window.
        patience: Slow in this many windows in a row (the first window excluded) to be named.
    """

    def __init__(self, every_n_steps: int = 50, factor: float = 1.5, patience: int = 2) -> None:
        if every_n_steps < 1:
            raise ValueError(f"StragglerCallback every_n_steps={every_n_steps} must be >= 1")
        if factor <= 1:
            raise ValueError(f"StragglerCallback factor={factor} must be > 1 (times the median of the others)")
        self.every_n_steps = every_n_steps
        self.factor = factor
        self.patience = max(1, patience)
        self.clock = IntervalTimer()
        #: Every gathered window, for inspection (rank 0 and the others alike).
        self.windows: list[Window] = []
        #: Ranks already named (each is named once).
        self.named: set[int] = set()
        self._places: list[str] = []
        self._streak: dict[int, int] = {}
        self._window_start = 0
        self._active = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """On several processes during fit: learn where each rank runs (one gather, at start-up only)."""
        self._active = stage == "fit" and trainer.world_size > 1
        if not self._active:
            return
        self.clock = IntervalTimer(cuda=trainer.strategy.root_device.type == "cuda")
        place = f"{socket.gethostname()}, {trainer.strategy.root_device}"
        self._places = [str(p) for p in gather_objects(place)]

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A new epoch: the first batch's interval starts when it arrives, not at the loader's start-up."""
        self.clock.cancel()
        self._window_start = trainer.global_step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        """The first batch of an epoch starts its interval here (later ones at the previous batch's end)."""
        if self._active:
            self.clock.start()

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Any) -> None:
        """The gradient all-reduce starts in backward: this rank's own work ends here."""
        if self._active:
            self.clock.stop()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        """Start the next interval (the next batch's loading counts); gather at the end of a window."""
        if not self._active:
            return
        step = trainer.global_step
        # Only the micro-batch that ended an optimizer step moves global_step past the window's start.
        if step % self.every_n_steps == 0 and step > self._window_start:
            self._gather(trainer, step)
        self.clock.start()

    def _gather(self, trainer: L.Trainer, step: int) -> None:
        steps = step - self._window_start
        mine = torch.tensor(self.clock.take() / steps, dtype=torch.float64)
        gathered = gather_ranks(trainer, mine).reshape(-1).tolist()
        window = Window(self._window_start, step, tuple(float(s) for s in gathered))
        self._window_start = step
        self.windows.append(window)
        if not trainer.is_global_zero:
            return
        if trainer.logger is not None:
            trainer.logger.log_metrics(
                {
                    "ranks/step_s_max": max(window.step_s),
                    "ranks/step_s_min": min(window.step_s),
                    "ranks/step_s_median": statistics.median(window.step_s),
                    "ranks/slowest": float(window.slowest),
                },
                step=step,
            )
        self._judge(window)

    def _judge(self, window: Window) -> None:
        if len(self.windows) == 1:
            return  # warm-up: compilation, caches and the loaders' first batches
        slow = window.slowest
        ratio = window.ratio(slow)
        for rank in list(self._streak):
            if rank != slow or ratio < self.factor:
                self._streak.pop(rank)
        if ratio < self.factor:
            return
        self._streak[slow] = self._streak.get(slow, 0) + 1
        if self._streak[slow] >= self.patience and slow not in self.named:
            self.named.add(slow)
            others = statistics.median(s for r, s in enumerate(window.step_s) if r != slow)
            sys.stderr.write(
                f"warning: rank {slow} ({self._places[slow] if self._places else '?'}) is a straggler: "
                f"{window.step_s[slow] * 1000:.1f} ms of its own work per step, {ratio:.1f}x the median of the "
                f"other ranks ({others * 1000:.1f} ms) for {self._streak[slow] * self.every_n_steps} steps "
                f"(to step {window.last_step}); every rank waits for it at each gradient all-reduce. "
                "Look at that host's load, data loading and device health.\n"
            )
