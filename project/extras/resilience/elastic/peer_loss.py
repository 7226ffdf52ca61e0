"""A lost peer under an elastic job: a survivor saves the last completed step alone, without any collective.

When a node of an elastic torchrun job goes away, the surviving ranks learn it in their next collective (gloo:
"Connection closed/reset by peer", within a second). Under DDP every survivor still holds the whole model and
optimizer state of the last completed optimizer step (the step in progress is never applied: its gradients were
being all-reduced), so saving it loses nothing; but Lightning's checkpoint path is collective (the dump gathers every
rank's random state, the guards compare the replicas, the save ends with a barrier) and the process group is broken.

So each survivor leaves the broken group for a process group of its own (a world of one, in memory: every collective
of the dump then completes at once with this rank's own values), and the ranks of one node take a node-local lock in
turn: the first dumps the checkpoint and writes it through the run's own writer (atomic, as every save), the others
find it written and end. Survivors on several nodes each commit the same step atomically onto the same name; the
file is one of them, complete. Under sharded layouts (fsdp, tensor parallel, zero1) no survivor holds the state:
nothing is saved and the restart resumes the newest checkpoint (the loss is bounded by the checkpoint interval).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from project.checkpoints import pending
from project.extras.resilience.lightning_private import BATCHES_STEPPED_KEY, dump_checkpoint
from project.parallel.failures import _LOST_PEER
from project.parallel.strategies import row_of


def lost_a_peer(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a collective that failed because another rank went away.

    Not a timeout (a rank that hangs is still there), not a bug of the model: those end the job as before.
    """
    seen: BaseException | None = error
    for _ in range(8):  # a wrapped error: its cause, or the error it was raised while handling
        if seen is None:
            return False
        if isinstance(seen, RuntimeError) and any(s in str(seen).lower() for s in _LOST_PEER):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def replicated_state(strategy: Any) -> bool:
    """Whether every rank holds the whole model and optimizer state (DDP), so that any survivor can save it."""
    row = row_of(strategy)
    return not (row.shards_parameters or row.shards_optimizer_state)


def at_step_boundary(trainer: Any, epoch_start_step: int) -> bool:
    """Whether the in-memory state is exactly that of ``trainer.global_step`` with the loops' counters agreeing.

    The loss is noticed inside the step after it (its gradient all-reduce, a logged value's reduction, validation):
    the weights and optimizer are then those of the last completed step and the loops resume after its batches.
    A loss in the middle of an accumulation window, or after an optimizer step but before its batch was counted,
    is not such a state: nothing is saved then, and the newest checkpoint is resumed instead.
    """
    progress = trainer.fit_loop.epoch_loop.batch_progress.current
    accumulation = max(1, int(trainer.accumulate_grad_batches))
    done = progress.completed
    return (
        done > 0  # the epoch's first step: the previous epoch's end was saved (at the same step)
        and progress.processed == done
        and done % accumulation == 0
        and trainer.global_step - epoch_start_step == done // accumulation
    )


def as_saved_at_batch_end(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The loops' counters of ``checkpoint`` as Lightning writes them in ``on_train_batch_end`` of the last step.

    Lightning resumes a mid-epoch checkpoint as one saved there: its last batch processed but not yet counted
    completed, and ``_batches_that_stepped`` (the logger's step) not yet increased; the restart then counts both.
    A dump taken inside the next step has both counted already, so without this the resumed run's logger step
    would run one ahead of ``global_step`` (and the logged steps would be skipped).
    """
    loop = checkpoint["loops"]["fit_loop"]
    progress = loop["epoch_loop.batch_progress"]
    for part in ("total", "current"):
        done = progress[part]["completed"]
        progress[part].update(ready=done, started=done, processed=done, completed=done - 1)
    loop["epoch_loop.state_dict"][BATCHES_STEPPED_KEY] -= 1
    return checkpoint


def leave_broken_group() -> bool:
    """Replace the broken default process group by a world of one held in memory (this rank alone).

    ``False`` when that could not be done (the old group would not come down): then nothing is saved here.
    """
    with contextlib.suppress(Exception):  # its peers are gone; tearing it down must not fail the save
        dist.destroy_process_group()
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    except Exception:  # the newest checkpoint is resumed instead, as under a sharded layout
        return False
    return True


@contextlib.contextmanager
def first_on_this_node(key: str, step: int) -> Iterator[bool]:
    """Held by one rank of this node at a time; yields whether no rank of this node saved ``step`` before it."""
    path = Path(tempfile.gettempdir()) / f"project-peer-loss-{key}.lock"
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # the others wait: none ends before the save is on disk
        try:
            handle.seek(0)
            first = handle.read().strip() != str(step)
            yield first
            if first:
                handle.seek(0)
                handle.truncate()
                handle.write(str(step))
                handle.flush()
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def save_alone(trainer: Any, path: str, lock_key: str) -> bool:
    """Dump and write the current step to ``path`` on this rank alone; ``False`` when another rank of this node did.

    Call it only when :func:`at_step_boundary` and :func:`replicated_state` hold, after :func:`leave_broken_group`.
    """
    with first_on_this_node(lock_key, trainer.global_step) as first:
        if first:
            checkpoint = as_saved_at_batch_end(dump_checkpoint(trainer))
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            trainer.strategy.checkpoint_io.save_checkpoint(checkpoint, path)
            pending.wait_for()  # a background write must be on disk before this rank ends
        return first
