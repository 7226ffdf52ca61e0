"""A signal to any rank stops every rank at the same optimizer step, saves that step, and exits for a requeue.

The handler only notes the signal (the rank may be inside a store call or a collective); the ranks agree on the
stop step out of band (:class:`project.parallel.stop.StopChannel`): a step costs one read of an int, not
Lightning's broadcast before every step. The stop raises :class:`~project.errors.Preempted` (exit code 75,
resumable); past the grace period the process ends with 75 anyway (docs/reliability.md, Preemption).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import lightning as L
import torch

from project.callbacks.timed_checkpoint import TimedCheckpoint
from project.checkpoints import pending
from project.errors import Preempted
from project.launch import stop_signals
from project.lightning_private import keep_own_signal_handlers, skip_sigterm_broadcast
from project.parallel.stop import STEPS_AHEAD, StopChannel


class StopOnSignal(L.Callback):
    """Stop every rank at the same step on a signal, save it, and exit with the "preempted, resumable" code.

    Takes over ``signals`` (e.g. ``SIGTERM``) for good; the process ends ``grace_s`` after the first, saved or not.
    A signal before the first step ends the rank at once, one after the last skips what follows: exit code 75.
    """

    def __init__(self, signals: list[str], grace_s: float) -> None:
        self.signals, self.grace_s = [signal.Signals[name] for name in signals], grace_s
        self._step, self._rank = 0, 0  # optimizer steps completed on this rank (read by the handler), its rank
        self._noted: tuple[int, str] | None = None  # this rank's own signal: (its step, what)
        self._channel: StopChannel | None = None
        stop_signals.install(signals, grace_s)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Keep Lightning's own handlers away (its SIGTERM handler broadcasts from inside the handler)."""
        keep_own_signal_handlers(trainer)
        stop_signals.reinstall()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Open the channel (several processes: one collective), then handle signals as stops at one step."""
        self._step, self._rank = trainer.global_step, trainer.global_rank
        skip_sigterm_broadcast(trainer)
        if trainer.world_size > 1:
            self._channel = StopChannel.open(trainer, on_agreed=stop_signals.start_grace)
        # log_dir is a broadcast: asked here, where every rank is, not in the grace period's thread
        folder = os.path.join(trainer.log_dir or trainer.default_root_dir, "checkpoints")
        stop_signals.set_kept(lambda: newest_checkpoint(folder))
        stop_signals.reinstall()
        stop_signals.set_phase("training", self._on_signal)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Training reached its end: a signal during the last steps still stops here (saved), else what follows runs."""
        wanted = self._noted is not None or (self._channel is not None and self._channel.agreed is not None)
        if trainer.world_size > 1:  # one collective: a proposal may not have reached every rank before the last step
            flag = torch.tensor(float(wanted), device=trainer.strategy.root_device)  # NCCL reduces GPU tensors only
            wanted = bool(trainer.strategy.reduce(flag, reduce_op="max").item())
        self._close()
        if wanted:
            agreed = self._channel.agreed if self._channel is not None else None
            _, why = self._noted or agreed or (None, "a signal to another rank")
            self._stop(trainer, why, after=" (the last step; the test and export after fit did not run)")
        stop_signals.set_phase("after")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """A failed or stopped run: further signals are noted only; the channel's watcher ends."""
        stop_signals.set_phase("ending")
        self._close()

    def _close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def _on_signal(self, signum: int) -> None:
        """Note the signal; propose the stop outside the handler (never a store call or collective in here)."""
        name = signal.Signals(signum).name
        if self._noted is not None:
            if signum == signal.SIGINT and stop_signals.first_signal() == "SIGINT":
                raise KeyboardInterrupt  # Ctrl+C twice: now
            return  # a repeat (SLURM's --signal, then SIGTERM): the stop under way goes on
        self._noted = (self._step, f"{name} to rank {self._rank}")
        if self._channel is not None:
            step, why = self._noted
            threading.Thread(target=self._channel.propose, args=(step + STEPS_AHEAD, why), daemon=True).start()
        stop_signals.start_grace(name)

    def _stop_step(self) -> tuple[int, str] | None:
        if self._channel is not None:
            return self._channel.agreed
        return (self._noted[0] + 1, self._noted[1]) if self._noted is not None else None  # one process: finish its step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After each optimizer step: stop here when this is the agreed step."""
        step = trainer.global_step
        if step == self._step:  # a micro-batch that did not step (accumulation)
            return
        self._step = step
        stop = self._stop_step()
        if stop is not None and step >= stop[0]:
            self._stop(trainer, stop[1])

    def _stop(self, trainer: L.Trainer, why: str, after: str = "") -> None:
        """Save this step on every rank, flush the writes, meet once, and end with the preempted code."""
        stop_signals.set_phase("ending")
        stop_signals.start_grace(why)  # this rank may have learnt of the stop from another: bound it, save it
        path = save_latest(trainer)
        pending.wait_for()
        trainer.strategy.barrier("project-stop")
        raise Preempted(
            f"stopped by {why} at step {trainer.global_step}{after}: {path} holds that step; resume with "
            f"`fit --resume auto` (exit code {Preempted.exit_code}: preempted, resumable)"
        )


def newest_checkpoint(folder: str) -> str:
    """What a stop that could not save keeps: the newest checkpoint file in ``folder`` (reads files only)."""
    try:
        files = [f for f in os.scandir(folder) if f.name.endswith(".ckpt") and not f.name.startswith(".")]
    except OSError:
        files = []
    if not files:
        return "the run had saved no checkpoint yet, so the steps it trained are lost"
    newest = max(files, key=lambda f: f.stat().st_mtime_ns)
    return f"the steps after the newest complete checkpoint ({newest.path}) are lost, it is kept"


def stopped_by_signal(error: BaseException, trainer: L.Trainer, restored: str | None) -> Preempted | None:
    """This rank's stop outside the training steps, else ``None`` (``restored``: the checkpoint it started from)."""
    phase = stop_signals.raised_in()
    if phase is None or isinstance(error, Preempted):
        return None
    name = stop_signals.first_signal()
    code = f"(exit code {Preempted.exit_code}: preempted, resumable)"
    if phase == "before":
        kept = f"{restored} still holds that step" if restored else "nothing was trained, so there is nothing to save"
        return Preempted(
            f"stopped by {name} to rank {trainer.global_rank} before the first training step: {kept}; "
            f"`fit --resume auto` starts it again {code}"
        )
    return Preempted(
        f"stopped by {name} to rank {trainer.global_rank} after the last training step ({trainer.global_step}): the "
        f"test and export after fit did not run; the checkpoints are kept, `fit --resume auto` runs them {code}"
    )


def save_latest(trainer: L.Trainer) -> str:
    """Save the current step where the run keeps its latest weights, through the run's checkpoint writer."""
    for callback in trainer.callbacks:
        if isinstance(callback, TimedCheckpoint):
            return callback.save_now(trainer)
    path = os.path.join(trainer.log_dir or trainer.default_root_dir, "checkpoints", "last.ckpt")
    trainer.save_checkpoint(path)
    return path
