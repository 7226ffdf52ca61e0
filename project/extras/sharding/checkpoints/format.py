"""The sharded checkpoint as a format of the core's (:class:`project.checkpoints.formats.CheckpointFormat`).

The layer's ``checkpoint_formats`` names :class:`ShardedFormat`; the core asks it whether a path is a sharded
folder and, where it is, how to read, merge, overwrite and recover it. Each method imports what it uses: the
core asks :meth:`ShardedFormat.holds` of every checkpoint it loads, also in a process that never shards.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

#: DCP's index and Lightning's part of a sharded checkpoint (the names :mod:`project.extras.sharding.checkpoints`
#: writes; here too so that asking costs no import of torch.distributed).
_DCP_METADATA, _LIGHTNING_META = ".metadata", "meta.pt"


class ShardedFormat:
    """A folder of per-rank shards (``last.ckpt/``: ``*.distcp``, DCP's ``.metadata``, Lightning's ``meta.pt``)."""

    def holds(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` is a complete sharded checkpoint folder (DCP's index and Lightning's ``meta.pt``)."""
        folder = Path(path)
        return folder.is_dir() and (folder / _DCP_METADATA).is_file() and (folder / _LIGHTNING_META).is_file()

    def incomplete(self, path: Path) -> str | None:
        """What a folder of DCP shards lacks to be a sharded checkpoint, as the error; ``None``: it holds no shards."""
        if not any(path.glob("*.distcp")) and not (path / _LIGHTNING_META).is_file():
            return None
        lacks = " and ".join(name for name in (_DCP_METADATA, _LIGHTNING_META) if not (path / name).is_file())
        if not lacks:
            return None
        return (
            f"'{path}' is an incomplete sharded (fsdp) checkpoint folder: it has no {lacks}, which the save "
            "writes last, once every rank's shards are written (a save killed before that, or a partial copy); "
            "give a complete checkpoint (e.g. an older one, or last.ckpt of the run) or copy the whole folder"
        )

    def summary(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """``meta.pt`` and a ``state_dict`` of meta tensors (shapes only): nothing loaded into memory."""
        from project.extras.sharding.checkpoints import read_summary

        return read_summary(path)

    def load(self, path: str | os.PathLike[str], weights_only: bool = False) -> dict[str, Any]:
        """The shards merged in this process into an ordinary Lightning checkpoint (no process group)."""
        from project.extras.sharding.checkpoints.merge import load_full_checkpoint

        return load_full_checkpoint(path, weights_only=weights_only)

    def write_over(self, path: Path, write: Callable[[IO[bytes]], Any]) -> None:
        """A checkpoint file written where the sharded folder is (a sharded run resumed on one process)."""
        from project.extras.sharding.checkpoints.save import write_file_over

        write_file_over(path, write)

    def hidden(self, folder: Path) -> dict[Path, Path]:
        """The names a swap by renames (a file system without an atomic exchange) left a hidden copy of: where."""
        from project.extras.sharding.checkpoints.save import hidden_checkpoints

        return hidden_checkpoints(folder)

    def final_name(self, path: Path) -> Path:
        """The name a checkpoint under a hidden swap name goes onto."""
        from project.extras.sharding.checkpoints.save import final_name

        return final_name(path)

    def recover(self, folder: Path) -> None:
        """Complete the swaps by renames a kill interrupted (the newest onto its name, no ``.old`` left)."""
        from project.extras.sharding.checkpoints.save import recover_swaps

        recover_swaps(folder)
