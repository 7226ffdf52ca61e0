"""The callback that runs ``check`` inside a short fit, so every launcher starts it like any run."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from project.callbacks.interval_timer import IntervalTimer
from project.callbacks.model_checks import unused_parameters_problem
from project.errors import RunFailure, UserError
from project.extras.check import invariance, probes
from project.extras.check.report import CheckReport
from project.parallel.collectives import gather_objects, process_group_size
from project.parallel.failures import defer_to_rank_zero
from project.parallel.strategies import layout_of

#: The fire drill: ``PROJECT_CHECK_FAULT=RANK:exit`` makes that rank exit before it joins,
#: ``RANK:value`` makes it send a wrong value; a way to see what a failure looks like.
FAULT_ENV = "PROJECT_CHECK_FAULT"
#: A file that receives the wall-clock time of the drill's fault, to measure how long naming it takes.
FAULT_STAMP_ENV = "PROJECT_CHECK_FAULT_STAMP"
#: Steps before the step time is measured (first-batch and allocation costs).
WARMUP_STEPS = 3


class CheckFailed(RunFailure):
    """``check`` found a fault; the message names the rank, host and device (exit code 1)."""


def drill(kind: str) -> bool:
    """Whether the fire drill asks this process (by its launcher's rank variables) for fault ``kind``."""
    rank, _, wanted = os.environ.get(FAULT_ENV, "").partition(":")
    mine = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
    fired = wanted == kind and rank == mine
    if fired and os.environ.get(FAULT_STAMP_ENV):
        Path(os.environ[FAULT_STAMP_ENV]).write_text(f"{time.time()}\n")
    return fired


class SelfCheckCallback(L.Callback):
    """Run the probes when training starts, time ``steps`` steps, then report and stop.

    Args:
        out: Where rank 0 writes ``check.json``.
        timeout_s: Seconds a rank may be missing from the barrier before it is named.
        steps: Timed training steps on the configured model and data (after a short warm-up).
    """

    def __init__(self, out: str | Path, timeout_s: float, steps: int) -> None:
        self.out = Path(out)
        self.timeout_s = timeout_s
        self.steps = steps
        self.report: CheckReport | None = None
        self._clock = IntervalTimer()
        self._started = 0.0
        self._looked_at_gradients = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The probes, in order; a wrong value or different weights stop the check before any timing."""
        device = trainer.strategy.root_device
        backend = dist.get_backend() if process_group_size() > 1 else None
        report = self.report = CheckReport(trainer.world_size, backend, places=probes.places(device))
        wrong, got, expected = probes.wrong_values(device, offset=1000.0 if drill("value") else 0.0)
        report.values_ok, report.all_reduce = not wrong and got == expected, (got, expected)
        report.failures += [
            f"{report.places[rank].describe()} sent a wrong value in the all-gather ({rank + 1} expected): "
            "its device or link corrupts data"
            for rank in wrong
        ]
        if not wrong and got != expected:
            report.failures.append(f"the all-reduce summed to {got:g}, not {expected:g}: the reduction is broken")
        report.barrier_wait_s = [float(w) for w in gather_objects(probes.barrier_wait(self.timeout_s))]
        report.bandwidth = probes.all_reduce_bandwidth(device)
        # under tensor parallelism the strategy's (dp, tp) mesh splits the tiny model as the run's layout does
        tensor_mesh = trainer.strategy.device_mesh if layout_of(trainer).tp > 1 else None
        difference = invariance.weight_difference(device, tensor_mesh)
        report.weight_difference = [float(d) for d in gather_objects(difference)]
        report.parallel_weights = "TP" if tensor_mesh is not None else "DDP"
        report.failures += [
            f"{report.places[rank].describe()}: {report.parallel_weights} weights differ from one process's by "
            f"{diff:.1e} (> {invariance.TOLERANCE:g})"
            for rank, diff in enumerate(report.weight_difference)
            if diff > invariance.TOLERANCE
        ]
        report.sampling_ok = invariance.sampler_matches_one_process(getattr(trainer.train_dataloader, "sampler", None))
        if report.sampling_ok is False:
            report.failures.append("the training loader's ranks do not draw the global batches of one process")
        if report.failures:
            self._finish(trainer)
        self._clock = IntervalTimer(cuda=device.type == "cuda")

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        """Start timing after the warm-up steps."""
        if trainer.global_step == WARMUP_STEPS and not self._started:
            self._sync(trainer)
            self._started = time.perf_counter()
        if trainer.global_step >= WARMUP_STEPS:
            self._clock.start()

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Any) -> None:
        """This rank's own work ends where the gradient all-reduce begins."""
        self._clock.stop()

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After the first backward: parameters DDP would wait for in vain fail the check, as its one-line verdict."""
        if self._looked_at_gradients:
            return
        self._looked_at_gradients = True
        problem = unused_parameters_problem(trainer, pl_module)
        if problem is not None:
            assert self.report is not None
            self.report.failures.append(str(problem))
            self._finish(trainer, mistake=True)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Gather the step times, report, and fail if anything failed."""
        steps = max(1, trainer.global_step - WARMUP_STEPS)
        self._sync(trainer)
        step_s = (time.perf_counter() - self._started) / steps if self._started else 0.0
        assert self.report is not None
        self.report.step_s = [float(s) for s in gather_objects(step_s)]
        self.report.compute_s = [float(s) for s in gather_objects(self._clock.take() / steps)]
        self._finish(trainer)

    def _sync(self, trainer: L.Trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def _finish(self, trainer: L.Trainer, mistake: bool = False) -> None:
        """Rank 0 prints and writes the report; every rank raises the same failure (they all know it).

        A ``mistake`` of the configured model (not of the layout) is a :class:`UserError` (exit code 2), said
        by rank 0 alone when its launcher stops the others.
        """
        assert self.report is not None
        if trainer.is_global_zero:
            self.report.write(self.out)
            self.report.print()
            print(f"Wrote {self.out}", flush=True)
        if not self.report.failures:
            return
        verdict = f"check failed: {'; '.join(self.report.failures)}; details in {self.out}"
        if mistake:
            defer_to_rank_zero(trainer)
            raise UserError(verdict)
        raise CheckFailed(verdict)
