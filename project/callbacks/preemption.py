"""A signal to any rank stops every rank at the same optimizer step, saves that step, and exits for a requeue.

Clusters stop jobs by signal: SLURM sends SIGTERM to every task (and a chosen signal such as SIGUSR1 ahead of
it with ``sbatch --signal``), Kubernetes sends SIGTERM to the pod, torchrun's agent forwards what it gets to its
workers, a terminal sends SIGINT. The handler only notes the signal (a handler must not start a store call or a
collective: the rank may be inside one); the ranks agree on the stop step out of band
(:class:`project.parallel.stop.StopChannel`), so an ordinary step costs one read of an int. Lightning's own way
(``_broadcast_sigterm_tensor``: a broadcast and a host sync before every step) is switched off for runs of the
template.

At the stop step every rank saves through the run's own checkpoint writer (the :class:`TimedCheckpoint`'s
``last.ckpt`` when the config has one, else ``checkpoints/last.ckpt``), waits for its background writes, meets the
others once, and raises :class:`~project.errors.Preempted`: exit code 75, "preempted, resumable", which
``fit --resume auto`` continues. If the stop has not completed within the grace period, the process ends with that
code anyway (an atomic save never leaves a partial file behind). A second SIGINT (Ctrl+C twice) interrupts at once.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import lightning as L

from project.callbacks.timed_checkpoint import TimedCheckpoint
from project.checkpoints import pending
from project.errors import Preempted
from project.lightning_private import skip_sigterm_broadcast
from project.parallel.stop import STEPS_AHEAD, StopChannel


class StopOnSignal(L.Callback):
    """Stop every rank at the same step on a signal, save it, and exit with the "preempted, resumable" code.

    Args:
        signals: Names of the signals that stop training (e.g. ``["SIGTERM", "SIGINT", "SIGUSR1"]``).
        grace_s: Seconds from the first signal within which the process ends, saved or not.
    """

    def __init__(self, signals: list[str], grace_s: float) -> None:
        self.signals = [signal.Signals[name] for name in signals]
        self.grace_s = grace_s
        self._step = 0  # optimizer steps completed on this rank, read by the handler
        self._rank = 0
        self._noted: tuple[int, str] | None = None  # this rank's own signal: (its step, what)
        self._channel: StopChannel | None = None
        self._previous: dict[signal.Signals, Any] = {}

    # ------------------------------------------------------------------ set-up
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Install the handlers (after Lightning's, which they replace) and, on several processes, the channel."""
        self._step, self._rank = trainer.global_step, trainer.global_rank
        skip_sigterm_broadcast(trainer)
        if trainer.world_size > 1:
            self._channel = StopChannel.open(trainer)
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers belong to the main thread (a notebook's forked rank runs there too)
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        if trainer.received_sigterm:  # Lightning's handler saw one before this one was installed
            self._on_signal(signal.SIGTERM, None)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Training is over: the signals mean what they meant before; the channel's watcher ends."""
        self._restore()
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """A failed or stopped run: the signals mean what they meant before; the channel's watcher ends."""
        self.on_train_end(trainer, pl_module)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    # ------------------------------------------------------------------ the signal
    def _on_signal(self, signum: int, frame: Any) -> None:
        """Note the signal; propose the stop outside the handler (never a store call or collective in here)."""
        name = signal.Signals(signum).name
        if self._noted is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # Ctrl+C twice: now
            return
        self._noted = (self._step, f"{name} to rank {self._rank}")
        if self._channel is not None:
            step, why = self._noted
            threading.Thread(target=self._channel.propose, args=(step + STEPS_AHEAD, why), daemon=True).start()
        threading.Thread(target=self._end_after_grace, args=(name,), daemon=True).start()

    def _end_after_grace(self, name: str) -> None:
        threading.Event().wait(self.grace_s)
        os.write(
            2,
            f"error: the stop on {name} did not complete within {self.grace_s:g} s (parallel.stop_grace_s); the "
            "newest complete checkpoint is kept, resume with `fit --resume auto`\n".encode(),
        )
        os._exit(Preempted.exit_code)

    def _stop_step(self) -> tuple[int, str] | None:
        if self._channel is not None:
            return self._channel.agreed
        if self._noted is not None:  # one process: finish the step it is in
            step, why = self._noted
            return step + 1, why
        return None

    # ------------------------------------------------------------------ the stop
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

    def _stop(self, trainer: L.Trainer, why: str) -> None:
        """Save this step on every rank, flush the writes, meet once, and end with the preempted code."""
        path = save_latest(trainer)
        pending.wait_for()
        trainer.strategy.barrier("project-stop")
        raise Preempted(
            f"stopped by {why} at step {trainer.global_step}: {path} holds that step; resume with "
            f"`fit --resume auto` (exit code {Preempted.exit_code}: preempted, resumable)"
        )


def save_latest(trainer: L.Trainer) -> str:
    """Save the current step where the run keeps its latest weights, through the run's checkpoint writer."""
    for callback in trainer.callbacks:
        if isinstance(callback, TimedCheckpoint):
            return callback.save_now(trainer)
    folder = os.path.join(trainer.log_dir or trainer.default_root_dir, "checkpoints")
    path = os.path.join(folder, "last.ckpt")
    trainer.save_checkpoint(path)
    return path
