"""How the fsdp strategy saves and loads: atomic sharded folders, written in the background unless told not to.

A mixin of :class:`~project.extras.sharding.fsdp.strategy.FullyShardStrategy`: every rank writes its shards into a
hidden folder and rank 0 moves it onto the name once complete (:mod:`project.extras.sharding.checkpoints.save`), in
the background with ``parallel.fsdp.async_save`` (:mod:`project.extras.sharding.checkpoints.asynchronous`); a load
reshards onto this world size, or shards a plain file here (:mod:`project.extras.sharding.checkpoints.load`), both
under the project's pickle policy.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn

from project.checkpoints import pending
from project.extras.sharding.checkpoints import is_sharded_checkpoint
from project.extras.sharding.checkpoints.asynchronous import AsyncShardedWriter
from project.extras.sharding.checkpoints.load import load_full_into, load_sharded_into
from project.extras.sharding.checkpoints.save import save_sharded


class ShardedCheckpoints(ModelParallelStrategy):
    """Save, remove and load checkpoints for the fsdp strategy (``self._writer``: its background writer)."""

    _writer: AsyncShardedWriter

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """Every rank writes its shards into a hidden folder; rank 0 moves it onto the name when complete.

        With ``async_save`` the write goes on in the background once the shards are copied; the next save waits
        for it, and raises it if it failed.
        """
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options (got {storage_options!r})")
        if self._writer.ready:
            self._writer.wait()  # every rank alike, before the collectives of this save
        path = Path(self.broadcast(str(filepath)))
        token = self.broadcast(uuid.uuid4().hex[:12])
        path.parent.mkdir(parents=True, exist_ok=True)
        if self._writer.ready:
            self._writer.save(checkpoint, path, token)
        else:
            save_sharded(checkpoint, path, token, self.is_global_zero, self.barrier)

    def remove_checkpoint(self, filepath: Any) -> None:
        """Rank 0 removes ``filepath``; after a background save, only once it (and those before) succeeded."""
        if not self._writer.ready:
            super().remove_checkpoint(filepath)
        elif self.is_global_zero:
            self._writer.remove(Path(filepath))

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """A sharded checkpoint, resharded onto this world size, or a plain file, sharded here (both read safely).

        The optimizer state is read for ``fit`` only: the test of the best checkpoint after a fit, in the same
        process, has the fit's optimizers still, and needs none of their state (as Lightning's FSDP strategy).
        """
        path = Path(self.broadcast(str(checkpoint_path)))
        pending.wait_for(path)  # a background save of it: on every rank, until it is under its name
        assert self.model is not None and self.lightning_module is not None
        fitting = self.lightning_module.trainer.state.fn == TrainerFn.FITTING
        optimizers = self.optimizers if fitting else []
        strict = self.lightning_module.strict_loading
        if is_sharded_checkpoint(path):
            return load_sharded_into(path, self.model, optimizers, strict=strict)
        # A file (DDP's, one process's, consolidate's): the CLI's read of it, not Lightning's second one.
        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        load_full_into(path, checkpoint, self.model, optimizers, strict=strict)
        return checkpoint

    def teardown(self) -> None:
        """Finish the background save (every rank; raise it if it failed), Lightning's teardown, the checkpoint IO's.

        ModelParallelStrategy skips the checkpoint IO's teardown: its queued removals finish here.
        """
        try:
            self._writer.teardown()
        finally:
            super().teardown()
            self.checkpoint_io.teardown()
