"""An elastic torchrun job (``--nnodes MIN:MAX``): a lost node saves what it can, and every size change is recorded.

On a lost peer a survivor saves the last completed step alone (``peer_loss`` beside this module: under DDP, nothing
is redone), says in one line which node was lost, at which step and what happens next, and ends so that
torchrun restarts the job on the nodes that remain. On a join torchrun stops the workers with SIGTERM: the stop on
a signal (:mod:`project.callbacks.preemption`) saves the step it stops at. The restarted run resumes with
``--resume auto``; its rank 0 adds the change to ``membership.json`` in the run directory (step, old and new world
size, steps redone, seconds from the loss to the first step at the new size).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L

from project.callbacks.timed_checkpoint import TimedCheckpoint
from project.checkpoints.atomic import atomic_write_text
from project.errors import Preempted
from project.extras.resilience.elastic.job import ElasticJob, end_job
from project.extras.resilience.elastic.peer_loss import (
    at_step_boundary,
    first_on_this_node,
    leave_broken_group,
    lost_a_peer,
    replicated_state,
    save_alone,
)
from project.runs import run_directory

#: The record of the job's size changes, beside plan.json.
MEMBERSHIP_FILE = "membership.json"


def read_membership(run_dir: str | Path) -> dict[str, Any]:
    """``membership.json`` of a run directory (an empty record when there is none yet)."""
    try:
        return json.loads((Path(run_dir) / MEMBERSHIP_FILE).read_text())
    except (OSError, ValueError):
        return {"changes": []}


def _write_membership(run_dir: str, record: dict[str, Any]) -> None:
    atomic_write_text(os.path.join(run_dir, MEMBERSHIP_FILE), json.dumps(record, indent=2) + "\n")


def _ranks(first: int, count: int) -> str:
    return f"rank {first}" if count == 1 else f"ranks {first}-{first + count - 1}"


class ElasticCallback(L.Callback):
    """Save on a lost peer, record each membership change; added to every fit of an elastic torchrun job.

    Args:
        job: The elastic job this process is a worker of.
    """

    def __init__(self, job: ElasticJob) -> None:
        self.job = job
        self._run_dir: str | None = None
        self._checkpoint: str | None = None
        self._epoch_start: int | None = None
        self._saved_world: int | None = None  # the world size of the checkpoint this run resumed
        self._first_step_pending = False
        self._world_size = 0

    # ------------------------------------------------------------------ state and records
    def state_dict(self) -> dict[str, Any]:
        """The world size that wrote the checkpoint (a restart compares it with its own)."""
        return {"world_size": self._world_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the saved world size until training starts."""
        self._saved_world = state_dict.get("world_size")

    def plan_record(self, trainer: L.Trainer) -> dict[str, Any]:
        """What plan.json says of the elastic job (``elastic``): its range, what a lost node costs, where changes go."""
        if replicated_state(trainer.strategy):
            loss = "nothing: a survivor saves the last completed step (the state is replicated)"
        else:
            loss = "the steps since the newest checkpoint (the state is sharded: none of the survivors holds it)"
        join = "nothing: the stop for the restart saves its step"
        nodes = f"{self.job.min_nodes}:{self.job.max_nodes}"
        record = {"nnodes": nodes, "a_lost_node_costs": loss, "a_join_costs": join, "changes": MEMBERSHIP_FILE}
        return {"elastic": record}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Every rank knows the world size it trains at."""
        self._world_size = trainer.world_size

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Where a save goes (known now, while collectives work); rank 0 records a change of size."""
        self._run_dir = run_directory(trainer)
        timed = next((c for c in trainer.callbacks if isinstance(c, TimedCheckpoint)), None)
        name = {"epoch": trainer.current_epoch, "step": trainer.global_step}
        folder = os.path.join(self._run_dir or trainer.default_root_dir, "checkpoints")
        self._checkpoint = timed.format_checkpoint_name(name) if timed else os.path.join(folder, "last.ckpt")
        if trainer.is_global_zero and self._run_dir is not None:
            self._record_change(trainer)

    def _record_change(self, trainer: L.Trainer) -> None:
        record = read_membership(self._run_dir or ".")
        left = record.pop("left", None)
        old = (left or {}).get("world_size", self._saved_world)
        if left is None and (old is None or old == trainer.world_size):
            return  # a new run, or a resume at the same size with nothing recorded
        reached = (left or {}).get("step", trainer.global_step)
        record["changes"].append({
            "step": trainer.global_step, "old_world_size": old, "new_world_size": trainer.world_size,
            "steps_redone": max(0, reached - trainer.global_step), "cause": (left or {}).get("cause", "a restart"),
            "left_at": (left or {}).get("time"),
        })  # fmt: skip
        self._first_step_pending = True
        _write_membership(self._run_dir or ".", record)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The epoch's first step is known at its first batch."""
        self._epoch_start = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """The step this epoch began at (a resumed epoch starts at ``batch_idx`` > 0)."""
        if self._epoch_start is None:
            self._epoch_start = trainer.global_step - batch_idx // max(1, int(trainer.accumulate_grad_batches))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """The first step at the new size: how long after the old size left (rank 0)."""
        if self._first_step_pending and trainer.is_global_zero and self._run_dir is not None:
            self._first_step_pending = False
            record = read_membership(self._run_dir)
            change = record["changes"][-1]
            if change.get("left_at") is not None:
                change["seconds_to_first_step"] = round(time.time() - change["left_at"], 1)
                _write_membership(self._run_dir, record)

    # ------------------------------------------------------------------ leaving
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """A stop for a restart (rank 0 notes the step); a lost peer (a survivor saves, says it, ends)."""
        if isinstance(exception, Preempted):
            if trainer.is_global_zero and self._run_dir is not None:
                cause = "the workers were stopped by a signal (torchrun restarts them when a node joins)"
                self._note_left(trainer, cause, saved=True)
            return
        if self._run_dir is not None and lost_a_peer(exception):
            self._after_lost_peer(trainer, exception)

    def _note_left(self, trainer: L.Trainer, cause: str, saved: bool) -> None:
        record = read_membership(self._run_dir or ".")
        record["left"] = {"step": trainer.global_step, "world_size": trainer.world_size, "cause": cause,
                          "saved": saved, "time": time.time()}  # fmt: skip
        _write_membership(self._run_dir or ".", record)

    def _after_lost_peer(self, trainer: L.Trainer, exception: BaseException) -> None:
        """Save alone where the state allows it, say it once per node, flush the logs and end this rank."""
        step, world = trainer.global_step, trainer.world_size
        local = int(os.environ.get("LOCAL_WORLD_SIZE", trainer.num_devices))
        node = int(os.environ.get("GROUP_RANK", trainer.node_rank))
        nodes = world // local if local else 0
        lost = f"node {1 - node} ({_ranks(local * (1 - node), local)})" if nodes == 2 else "another node's ranks"
        saveable = replicated_state(trainer.strategy) and at_step_boundary(trainer, self._epoch_start or 0)
        saveable = saveable and leave_broken_group()  # only a save needs a group; sharded layouts keep theirs
        key = f"{self.job.run_id}-{os.getppid()}-{self.job.restart_count}"  # this node's workers of this attempt
        if saveable:
            first = save_alone(trainer, self._checkpoint or "last.ckpt", key)
            kept = f"node {node} saved step {step} to {self._checkpoint}, so no step is redone"
        else:
            first = self._first_to_say(key, step)
            kept = (
                "the state is sharded (or the loss came inside a step), so nothing was saved: the job resumes "
                "from its newest checkpoint and redoes the steps after it"
            )
        if first:
            self._note_left(trainer, f"lost {lost}", saved=saveable)
        for logger in trainer.loggers:  # the curves up to this step are on disk before the rank ends
            logger.finalize("failed")
        said = f"elastic: lost {lost} at step {step} (world of {world}; this is node {node}, "
        said += f"{_ranks(local * node, local)}); {kept}; "
        if nodes and nodes - 1 < self.job.min_nodes:  # torchrun would wait for a node to join, up to its timeout
            end_job(
                f"{said}the job needs at least {self.job.min_nodes} nodes ({self.job.describe()}) and at most "
                f"{nodes - 1} remain, so it ends here: start the lost node(s) again with the same command and the job "
                "resumes (--resume auto)",
                code=1,
                say=first,
            )
        if first:
            sys.stderr.write(
                f"{said}torchrun restarts the job on the nodes that remain ({self.job.describe()}) and it resumes "
                "there with --resume auto\n"
            )
        sys.stderr.flush()
        os._exit(1)  # the survivors end together; the agent restarts them (nothing else of this fit can run)

    @staticmethod
    def _first_to_say(key: str, step: int) -> bool:
        with first_on_this_node(key, step) as first:
            return first
