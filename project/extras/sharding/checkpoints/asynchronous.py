"""Sharded checkpoints written in the background: a save costs the training a copy of its shards, not the disk.

:class:`AsyncShardedWriter` writes what :func:`~project.extras.sharding.checkpoints.save.save_sharded` writes (every
rank's shards into a hidden folder, rank 0's ``meta.pt``, one swap onto the name), off the training thread, under
the rules of :class:`~project.checkpoints.background.BackgroundCheckpointIO`:

- ``save`` copies this rank's shards into host memory (DCP's stager, whose buffers are kept from one save to
  the next: a save copies into memory that is already there), hands them to DCP's ``async_save`` on a thread
  and returns. The background part's collectives run over a gloo group of their own, created once on every
  rank, never over the training's group, whose collectives go on meanwhile. At most one save is in flight:
  the next one waits for it first.
- The folder takes its name only when complete: DCP's coordinator writes ``.metadata`` after gathering every
  rank's write results, then rank 0 adds ``meta.pt``, syncs and swaps the folder in, then tells every rank the
  outcome. So on every rank a save ends when the checkpoint is under its name, or fails on every rank alike.
- A failed write is raised at the next save and at teardown (:class:`ShardedWriteError`: one line, said by rank
  0), never silently; the checkpoint it was to replace is intact. A kill at any point leaves the previous
  checkpoint under the name, or a hidden folder that ``--resume auto`` never picks.
- Removals (a ``ModelCheckpoint`` replacing its previous best) run on rank 0 after the saves queued before
  them, and only if those succeeded.
- Reads in this process wait for the write: the folder and its ``meta.pt`` are registered in :mod:`pending`.
- In a run directory given as a URL the same thread uploads each rank's own shards, and rank 0 commits the folder
  once every rank's upload is known complete (:meth:`project.run_store.RunStore.commit_sharded`); a save ends
  when it is committed.

Threads, not DCP's process executor (``AsyncCheckpointerType.PROCESS``): measured with
``python -m bench.extras.sharding.sharded_saves --compare``, both block the training for the copy alike, while the
process executor starts a second interpreter per rank at the first save (seconds), sends it the copy through a pipe
(the write takes longer), and writes log lines, and a traceback when its rank is killed, into the run's output.
"""

from __future__ import annotations

import sys
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# Called through the module: tests replace its steps to fault (tests/extras/sharding/: fsdp_faults.py,
# test_async_sharded_save.py).
from project.checkpoints import pending
from project.checkpoints.background import CheckpointWriteError, first_failure
from project.errors import Preempted, first_line
from project.extras.sharding.checkpoints import LIGHTNING_META
from project.extras.sharding.checkpoints import save as sharded_save
from project.run_store import active

#: Words of gloo's and nccl's errors when a peer went away during the write's collectives (a rank died).
_LOST_RANK = ("connection reset", "connection closed", "broken pipe", "socket closed")


class ShardedWriteError(CheckpointWriteError):
    """A sharded checkpoint could not be written in the background; every rank raises it, rank 0 says it."""

    said_by_rank_zero = True


def describe(error: BaseException) -> str:
    """One line for a failed write; DCP's ``CheckpointException`` names each failed rank's own error."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        return "; ".join(
            f"rank {rank}: {type(cause).__name__}: {first_line(cause)}" for rank, (cause, _) in sorted(failures.items())
        )
    return f"{type(error).__name__}: {first_line(error)}"


class AsyncShardedWriter:
    """One rank's side of the background sharded saves (every rank has one; every rank calls :meth:`save`)."""

    def __init__(self) -> None:
        self._group: Any = None
        self._rank_zero = False
        self._stager: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._in_flight: list[tuple[str, Future[None]]] = []

    @property
    def in_flight(self) -> bool:
        """Whether a save (or a removal queued behind it) is still running."""
        return any(not done.done() for _, done in self._in_flight)

    @property
    def ready(self) -> bool:
        """Whether :meth:`setup` made the background group (else the strategy saves synchronously)."""
        return self._group is not None

    def setup(self, timeout: timedelta | None) -> None:
        """Every rank, in the same order: the gloo group of the background writes, once (it outlives a fit).

        Args:
            timeout: How long one of its collectives may wait (the run's ``parallel.timeout_s``).
        """
        if self._group is None:
            kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
            self._group = dist.new_group(backend="gloo", **kwargs)
            self._rank_zero = dist.get_rank() == 0

    def save(self, checkpoint: dict[str, Any], path: Path, token: str) -> None:
        """Copy this rank's shards and write them (and, on rank 0, ``meta.pt`` and the swap) in the background.

        Args:
            checkpoint: Lightning's checkpoint dict, its ``state_dict`` and ``optimizer_states`` sharded (DTensors).
            path: The checkpoint's name (``.../last.ckpt``), the same on every rank.
            token: A name part shared by all ranks and unique to this save.

        Raises:
            ShardedWriteError: the previous save failed (on every rank alike).
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        self.wait()  # at most one in flight; the staging buffers are free again
        partial = sharded_save.partial_name(path, token)
        shards, meta = sharded_save.split(checkpoint)
        data = sharded_save.serialize(meta) if self._rank_zero else None
        upload = dcp.async_save(
            shards,
            storage_writer=sharded_save.shard_writer(partial),
            planner=sharded_save.shard_planner(),
            process_group=self._group,
            async_checkpointer_type=AsyncCheckpointerType.THREAD,
            async_stager=self._staging(),
        )
        assert isinstance(upload, Future)  # a stager that stages before returning: DCP's plain future
        done = self._submit(f"write the checkpoint {path}", self._complete, upload, partial, path, (token, data))
        pending.track(path, done)
        pending.track(path / LIGHTNING_META, done)

    def remove(self, path: Path) -> None:
        """Rank 0: remove ``path`` after the saves queued before (it may be one of them), if all of them succeeded.

        A ``ModelCheckpoint`` removes its previous best right after saving the new one: if that save failed, the
        previous best is the only one left and must stay.
        """
        before = [done for _, done in self._in_flight]
        self._submit(f"remove the checkpoint {path}", self._remove_after, before, path)

    def wait(self) -> None:
        """Block until the save in flight (and queued removals) finished; raise a failed save.

        Raises:
            ShardedWriteError: the save failed, on every rank alike (the checkpoint it was to replace is intact).
        """
        in_flight, self._in_flight = self._in_flight, []
        failed = first_failure(in_flight)
        if failed is not None:
            what, error = failed
            if any(words in str(error).lower() for words in _LOST_RANK):  # the disk is fine: a rank went away
                raise ShardedWriteError(
                    f"could not {what}: another rank went away during the write ({describe(error)}); the checkpoint "
                    "it was to replace is intact"
                ) from error
            raise ShardedWriteError(
                f"could not {what} ({describe(error)}); the checkpoint it was to replace is intact. Free disk space "
                "or fix the folder's permissions, then resume with `fit --resume auto`"
            ) from error

    def teardown(self) -> None:
        """Finish the writes and stop the thread; raise a failed write (say it, if another error ends the run)."""
        ending = sys.exc_info()[1]  # Lightning tears down in its handler of the run's own error
        try:
            self.wait()
        except ShardedWriteError as error:
            # A stop's message would say its checkpoint holds the step: it does not, so this error replaces it.
            if ending is None or isinstance(ending, Preempted):
                raise
            if self._rank_zero and "went away" not in str(error):  # a lost rank: the run's own error names it
                # keep the run's own error (what ended it), say this one
                sys.stderr.write(f"warning: {error}\n")
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self._stager is not None:
                self._stager.close()  # its staging buffers: one copy of this rank's shards
                self._stager = None

    def _staging(self) -> Any:
        # Kept across saves: it copies into the buffers of the previous save (no allocation, no page faults),
        # which is safe because a save first waits for the previous one. Pinned host memory where CUDA is.
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            options = StagingOptions(
                use_pinned_memory=torch.cuda.is_available(),
                use_shared_memory=False,
                use_async_staging=False,
                use_non_blocking_copy=False,
            )
            self._stager = DefaultStager(options)
        return self._stager

    def _complete(self, upload: Future[Any], partial: Path, path: Path, saved: tuple[str, bytes | None]) -> None:
        # On the writer thread. DCP raises a failure of any rank on every rank; rank 0's own steps after it are
        # told to all by one broadcast, which also holds every rank here until the checkpoint is in place.
        (token, data), error = saved, None
        try:
            upload.result()
            # rank 0 adds meta.pt and swaps the folder in (in object storage: after every rank's upload, then commits)
            active().commit_sharded(partial, path, token, data, self._group, sharded_save.finish)
        except BaseException as caught:  # DCP's CheckpointException is a BaseException
            error = caught
        verdict = [None if error is None else describe(error)]
        dist.broadcast_object_list(verdict, src=0, group=self._group)
        if error is not None:
            raise error
        if verdict[0] is not None:
            raise RuntimeError(f"on rank 0: {verdict[0]}")
        active().drop_node_copy(partial)

    def _remove_after(self, before: list[Future[None]], path: Path) -> None:
        # On the writer thread, after every future in `before` (one worker runs them in order).
        if any(done.exception() is not None for done in before):
            return
        try:
            sharded_save.remove_path(Path(path))
            active().withdraw(path)  # object storage: its commit, then its data
        except OSError as error:  # an extra checkpoint left behind costs disk, not the run
            sys.stderr.write(f"warning: could not remove the checkpoint {path} ({error})\n")

    def _submit(self, what: str, fn: Any, *args: Any) -> Future[None]:
        if self._executor is None:  # made lazily: teardown ends it, and a Trainer may fit again
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sharded-checkpoint-writer")
        done = self._executor.submit(fn, *args)
        self._in_flight.append((what, done))
        return done
