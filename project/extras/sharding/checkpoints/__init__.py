"""Sharded checkpoints (``scenario: fsdp``): what the folder holds, and reading it under the pickle policy.

A sharded checkpoint is a folder with the checkpoint's usual name (``last.ckpt/``): one ``__<rank>_0.distcp``
file per rank with that rank's shards of the weights and optimizer state, DCP's ``.metadata`` (where each shard
of each tensor lies) and Lightning's ``meta.pt`` (everything else: loops, callbacks, schedulers, epoch, step).

- **Atomic.** Every rank writes into a hidden ``.last.ckpt.<token>.tmp/`` folder; when all have finished (DCP
  writes ``.metadata`` only then) rank 0 adds ``meta.pt``, syncs, and swaps the folder onto its name in one
  ``renameat2(RENAME_EXCHANGE)`` (renames recoverable from any step where the file system lacks it). A kill at
  any point leaves the previous checkpoint under the name, or the new one committed beside it, or a hidden
  folder that nothing resumes from (:mod:`project.extras.sharding.checkpoints.save`).
- **Read safely.** DCP reads ``.metadata`` with plain pickle and small objects with ``weights_only=False``;
  here both go through the project's policy: only DCP's metadata classes and weights-only objects load,
  unless ``PROJECT_ALLOW_PICKLE=1`` (this module).
- **Any world size.** DCP reshards on load (2 -> 4 processes; :mod:`project.extras.sharding.checkpoints.load`), and
  :func:`~project.extras.sharding.checkpoints.merge.load_full_checkpoint` merges the shards into an ordinary Lightning
  checkpoint in one process, which is how one process (or DDP) resumes a sharded checkpoint and what
  ``python -m project consolidate`` writes.
- **Exact.** A parameter that never got a gradient (a head ``forward`` does not use) has no optimizer state in
  the checkpoint and none after loading it, as in the run that wrote it. A load is "incomplete or corrupt" only
  when reading fails; a key or shape of the model or optimizer that the checkpoint lacks "does not fit"
  (:mod:`project.extras.sharding.checkpoints.errors`).
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader

from project.checkpoints.loading import ALLOW_PICKLE_ENV, load_lightning_checkpoint, pickle_allowed, safe_load
from project.errors import UserError

# dcp_to_torch_save's planner: the public way to read a DCP folder into one process without process group,
# minus its unrestricted unpickling (torch has no public name for it).
from project.extras.sharding import lightning_private
from project.extras.sharding.checkpoints.errors import unsafe_error

#: DCP's index of the shards (written last, by rank 0, once every rank has written its shards).
DCP_METADATA = ".metadata"
#: Lightning's part of the checkpoint (``ModelParallelStrategy`` calls it so too).
LIGHTNING_META = "meta.pt"
#: The keys of the sharded state: the weights, and each optimizer's state by its position.
WEIGHTS = "state_dict"
OPTIMIZER = "optimizer_{}"

# The classes DCP's .metadata pickles (torch 2.13), by (module, name).
_METADATA_CLASSES = (
    {
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
        )
    }
    | lightning_private.CHECKPOINT_PRIVATE_GLOBALS
    | {
        ("torch", "Size"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("collections", "OrderedDict"),
    }
)


def is_sharded_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a complete sharded checkpoint folder (DCP's index and Lightning's ``meta.pt``)."""
    folder = Path(path)
    return folder.is_dir() and (folder / DCP_METADATA).is_file() and (folder / LIGHTNING_META).is_file()


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata``, refusing any class but DCP's own metadata records (and torch dtypes)."""

    def find_class(self, module: str, name: str) -> Any:
        """The allowed class, or an error naming the one the file wants."""
        if (module, name) in _METADATA_CLASSES or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")


class SafeReader(FileSystemReader):
    """DCP's file reader whose ``.metadata`` may hold DCP's metadata records only (unless pickle is allowed)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        """The index of the shards, read under the project's pickle policy."""
        if pickle_allowed():
            return super().read_metadata(*args, **kwargs)
        file = Path(self.path) / DCP_METADATA
        try:
            with open(file, "rb") as handle:
                metadata = _MetadataUnpickler(handle).load()
        except pickle.UnpicklingError as error:
            raise UserError(
                f"'{file}' holds a pickled {str(error).removeprefix('GLOBAL ')}, which only arbitrary code can "
                f"load, so it is refused; if you trust the checkpoint, rerun with {ALLOW_PICKLE_ENV}=1"
            ) from error
        except Exception as error:  # truncated or not a pickle at all
            raise UserError(f"'{file}' is truncated or corrupt and cannot be loaded ({error})") from error
        metadata.storage_meta = metadata.storage_meta or _storage_meta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _storage_meta() -> Any:
    from torch.distributed.checkpoint.metadata import StorageMeta

    return StorageMeta()


class _WeightsOnlyBytes:
    """Small non-tensor objects (optimizer hyperparameters) checked with ``weights_only=True`` before DCP loads them."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        """Refuse an object that needs more than weights-only unpickling; else DCP's own load puts it in place."""
        if not pickle_allowed():
            torch.load(value, weights_only=True)  # raises UnpicklingError naming what it would import
            value.seek(0)
        super().load_bytes(read_item, value)  # type: ignore[misc]


class SafeLoadPlanner(_WeightsOnlyBytes, DefaultLoadPlanner):
    """DCP's default load planner (into a state dict of the right shapes) with weights-only objects."""


class SafeEmptyPlanner(_WeightsOnlyBytes, lightning_private.EMPTY_LOAD_PLANNER):
    """Loads whatever the checkpoint holds (full tensors, no process group), with weights-only objects."""


def read_metadata(path: str | os.PathLike[str]) -> Any:
    """DCP's index of a sharded checkpoint, read safely (one line on failure)."""
    folder = Path(path)
    try:
        return SafeReader(folder).read_metadata()
    except Exception as error:
        raise unsafe_error(folder, error) from error


def read_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A sharded checkpoint without its tensors: ``meta.pt`` plus a ``state_dict`` of meta tensors (shapes only).

    Enough to choose it, compare it with the model, and read the callbacks' state; nothing is loaded into memory.
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    folder = Path(path)
    meta = safe_load(folder / LIGHTNING_META)
    if not isinstance(meta, dict):
        raise UserError(f"'{folder / LIGHTNING_META}' is not the metadata of a Lightning checkpoint")
    shapes = {}
    for key, item in read_metadata(folder).state_dict_metadata.items():
        if key.startswith(f"{WEIGHTS}.") and isinstance(item, TensorStorageMetadata):
            shapes[key[len(WEIGHTS) + 1 :]] = torch.empty(item.size, dtype=item.properties.dtype, device="meta")
    return {**meta, WEIGHTS: shapes}


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint to start from: a Lightning checkpoint file, or a sharded folder's summary (:func:`read_summary`)."""
    return read_summary(path) if is_sharded_checkpoint(path) else load_lightning_checkpoint(path)
