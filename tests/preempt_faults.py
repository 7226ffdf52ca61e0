"""Test-only signals for real runs of the CLI: ``--trainer.callbacks+=preempt_faults.SignalAtStep``.

What a scheduler does, at a known step: SIGTERM (or SIGUSR1, SIGINT) to one rank, to the last, or to every rank.
Each process records the steps it saw and its pid, so a test can check where it stopped and that it is gone.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import threading
import time
from pathlib import Path

import lightning as L
import torch.distributed as dist

from project.checkpoints.atomic import atomic_write_text
from project.lightning_private import launched_processes


class SignalAtStep(L.Callback):
    """After optimizer step ``step``, rank ``rank`` sends ``signal_name`` to ``to`` ("self", "all" or a rank).

    Args:
        step: The optimizer step after which the signal is sent.
        rank: The rank that sends it (-1: the last rank).
        signal_name: e.g. SIGTERM, SIGUSR1, SIGINT.
        to: "self"; "all" (rank 0 signals every rank of its node, itself last); or a global rank (rank 0 of one
            node only signals its own children).
        record: Folder where each rank writes ``rank<r>.json``: its pid, the step it signalled at, the last step.
    """

    def __init__(
        self, step: int, rank: int = 0, signal_name: str = "SIGTERM", to: str = "self", record: str = ""
    ) -> None:
        self.step, self.rank, self.signal_name, self.to, self.record = step, rank, signal_name, to, record
        self._seen = -1
        self._signalled: int | None = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        """Send the signal once, right after the chosen step; note the last step reached."""
        step = trainer.global_step
        if step == self._seen:
            return
        self._seen = step
        rank = self.rank if self.rank >= 0 else trainer.world_size - 1
        if step == self.step and trainer.global_rank == rank and self._signalled is None:
            self._signalled = step
            signum = signal.Signals[self.signal_name]
            if self.to == "self":
                os.kill(os.getpid(), signum)
            elif self.to == "all":
                for process in launched_processes(trainer.strategy):
                    os.kill(process.pid, signum)
                os.kill(os.getpid(), signum)
            else:
                target = [p for local, p in enumerate(launched_processes(trainer.strategy), 1) if local == int(self.to)]
                os.kill(target[0].pid, signum)
        self._write(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """Record the last step on the way out too."""
        self._write(trainer)

    def _write(self, trainer: L.Trainer) -> None:
        if not self.record:
            return
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        data = {"pid": os.getpid(), "signalled_at": self._signalled, "last_step": trainer.global_step}
        atomic_write_text(Path(self.record, f"rank{rank}.json"), json.dumps(data))


class CountCollectives(L.Callback):
    """Count the Python-level collectives each optimizer step runs on this rank, into ``record/collectives<r>.json``.

    DDP's gradient all-reduce runs inside its C++ reducer and is not counted: what is counted is what the
    template or Lightning add around a step (a broadcast of a flag, a barrier, an object gather).
    """

    NAMES = ("broadcast", "all_reduce", "barrier", "all_gather", "all_gather_object", "broadcast_object_list")

    def __init__(self, record: str) -> None:
        self.record = record
        self.counts: dict[int, int] = {}
        self._step = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Wrap the collectives of torch.distributed (looked up at call time by Lightning and the template)."""
        for name in self.NAMES:
            original = getattr(dist, name)

            def counted(*args, _original=original, **kwargs):
                self.counts[self._step] = self.counts.get(self._step, 0) + 1
                return _original(*args, **kwargs)

            setattr(dist, name, counted)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        """Collectives from here on belong to the next step."""
        self._step = trainer.global_step + 1

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """Write the counts (the run ends by the stop)."""
        self.teardown(trainer, pl_module, "fit")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Write the counts."""
        atomic_write_text(Path(self.record, f"collectives{trainer.global_rank}.json"), json.dumps(self.counts))


class StepFile(L.Callback):
    """Rank 0 writes its last optimizer step to ``path`` after each step, and each step lasts at least ``delay_s``.

    What a test outside the job (a scheduler's signal) needs: to see how far training got, with time to act.
    """

    def __init__(self, path: str, delay_s: float = 0.0) -> None:
        self.path, self.delay_s = path, delay_s

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        """Note the step; hold the step for ``delay_s`` (a slower model)."""
        if trainer.is_global_zero:
            atomic_write_text(self.path, f"{trainer.global_step}\n")  # a reader never sees it empty
        threading.Event().wait(self.delay_s)


class WaitAt(L.Callback):
    """At a named moment before (or after) the training steps, each rank notes its pid and waits: the test signals.

    What a scheduler's signal meets when a run is slow to start: each rank writes ``record/at<rank>.json`` (its pid)
    on arriving at ``moment`` and then waits ``wait_s`` seconds (in short sleeps, so a signal handler runs at once),
    so the test outside can send a signal to the processes it chooses while they are there.

    Args:
        moment: ``setup`` (the callbacks' setup), ``restore`` (Lightning restoring a checkpoint's callback state),
            ``micro_batch`` (inside the ``micro_batch: auto`` trial step), ``sanity_check`` (a validation batch of the
            sanity check), ``validation`` (a validation batch during training: a long validation), ``test`` (a
            batch of the test after fit).
        record: Folder for the ``at<rank>.json`` files.
        wait_s: How long each rank waits there.
    """

    def __init__(self, moment: str, record: str, wait_s: float = 30.0) -> None:
        self.moment, self.record, self.wait_s = moment, record, wait_s
        self._done = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """``setup``: wait here; ``micro_batch``: wrap the trial step (looked up at call time) to wait in it."""
        if self.moment == "setup":
            self._arrive()
        elif self.moment == "micro_batch":
            from project.extras.microbatch import search  # the microbatch layer's (the test skips without it)

            original = search.try_micro_batch

            def waiting(*args, **kwargs):
                self._arrive()
                return original(*args, **kwargs)

            search.try_micro_batch = waiting

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint) -> None:
        """``restore``: Lightning is restoring the run from a checkpoint."""
        if self.moment == "restore":
            self._arrive()

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx, *_) -> None:
        """``sanity_check`` / ``validation``: a validation batch before training, or during it."""
        if self.moment == ("sanity_check" if trainer.sanity_checking else "validation"):
            self._arrive()

    def on_test_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx, *_) -> None:
        """``test``: the test after fit (training is over)."""
        if self.moment == "test":
            self._arrive()

    def _arrive(self) -> None:
        if self._done:
            return
        self._done = True
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        atomic_write_text(Path(self.record, f"at{rank}.json"), json.dumps({"pid": os.getpid()}))
        for _ in range(int(self.wait_s * 10)):
            time.sleep(0.1)


class SignalAgainAtExit(L.Callback):
    """Rank 0 sends itself ``signal_name`` once more as its interpreter exits, ``after_s`` seconds after fit ended.

    A scheduler's second signal (SLURM's ``--signal`` ahead of the SIGTERM at the time limit) reaching a process that
    is already ending on the first: it must not end it by that signal. ``record/again.json`` says it was sent.
    """

    def __init__(self, signal_name: str, record: str, after_s: float = 1.0) -> None:
        self.signal_name, self.record, self.after_s = signal_name, record, after_s

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Rank 0: send it at exit."""
        if trainer.is_global_zero:
            atexit.register(self._again)

    def _again(self) -> None:
        time.sleep(self.after_s)
        atomic_write_text(Path(self.record, "again.json"), json.dumps({"pid": os.getpid()}))
        os.kill(os.getpid(), signal.Signals[self.signal_name])
        time.sleep(0.5)  # the handler runs here, or the default action ends the process by the signal


class KillInShardWrite(L.Callback):
    """Rank ``rank`` SIGKILLs itself while it writes its shards of the first sharded save at or after ``step``.

    The write runs on the background writer thread (FSDP's ``dcp.async_save``): the other ranks learn of the death in
    that write's collective, not in the training loop's.
    """

    def __init__(self, step: int, rank: int = 1) -> None:
        self.step, self.rank = step, rank

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Wrap the shard writer (looked up at call time) on the chosen rank."""
        from project.extras.sharding.checkpoints import save as sharded_save

        if trainer.global_rank != self.rank:
            return
        make = sharded_save.shard_writer

        def writer(partial):
            made = make(partial)
            if trainer.global_step >= self.step:
                write = made.write_data

                def dying(*args, **kwargs):
                    os.kill(os.getpid(), signal.SIGKILL)
                    return write(*args, **kwargs)

                made.write_data = dying
            return made

        sharded_save.shard_writer = writer
