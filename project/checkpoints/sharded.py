"""Sharded checkpoints (``scenario: fsdp``): ``torch.distributed.checkpoint`` folders, atomic, read safely, merged.

A sharded checkpoint is a folder with the checkpoint's usual name (``last.ckpt/``): one ``__<rank>_0.distcp``
file per rank with that rank's shards of the weights and optimizer state, DCP's ``.metadata`` (where each shard
of each tensor lies) and Lightning's ``meta.pt`` (everything else: loops, callbacks, schedulers, epoch, step).

- **Atomic.** Every rank writes into a hidden ``.last.ckpt.<token>.tmp/`` folder; when all have finished (DCP
  writes ``.metadata`` only then) rank 0 adds ``meta.pt``, syncs, and swaps the folder onto its name in one
  ``renameat2(RENAME_EXCHANGE)`` (two renames where the file system lacks it). A kill at any point leaves the
  previous checkpoint under the name, or a hidden folder that nothing resumes from.
- **Read safely.** DCP reads ``.metadata`` with plain pickle and small objects with ``weights_only=False``;
  here both go through the project's policy: only DCP's metadata classes and weights-only objects load,
  unless ``PROJECT_ALLOW_PICKLE=1``.
- **Any world size.** DCP reshards on load (2 -> 4 processes), and :func:`load_full_checkpoint` merges the
  shards into an ordinary Lightning checkpoint in one process, which is how one process (or DDP) resumes
  a sharded checkpoint and what ``python -m project consolidate`` writes.
- **Exact.** A parameter that never got a gradient (a head ``forward`` does not use) has no optimizer state in
  the checkpoint and none after loading it, as in the run that wrote it. A load is "incomplete or corrupt" only
  when reading fails; a key or shape of the model or optimizer that the checkpoint lacks "does not fit".
"""

from __future__ import annotations

import ctypes
import io
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import (
    CheckpointException,
    DefaultLoadPlanner,
    DefaultSavePlanner,
    FileSystemReader,
    FileSystemWriter,
)

# dcp_to_torch_save's planner and loader: the public way to read a DCP folder into one process without
# process group, minus its unrestricted unpickling (torch has no public name for either).
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from project.checkpoints.loading import ALLOW_PICKLE_ENV, load_lightning_checkpoint, pickle_allowed, safe_load
from project.errors import UserError

#: DCP's index of the shards (written last, by rank 0, once every rank has written its shards).
DCP_METADATA = ".metadata"
#: Lightning's part of the checkpoint (``ModelParallelStrategy`` calls it so too).
LIGHTNING_META = "meta.pt"
_WEIGHTS = "state_dict"
_OPTIMIZER = "optimizer_{}"
#: What a DCP load raises: any error, or its CheckpointException (a BaseException that gathers every rank's failure).
_LOAD_ERRORS = (Exception, CheckpointException)
#: The DCP step whose failure means the state to load does not fit the checkpoint (a key or a shape it lacks).
_PLAN_STEP = "plan"

# The classes DCP's .metadata pickles (torch 2.13), by (module, name).
_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("collections", "OrderedDict"),
}


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


class _SafeEmptyPlanner(_WeightsOnlyBytes, _EmptyStateDictLoadPlanner):
    """Loads whatever the checkpoint holds (full tensors, no process group), with weights-only objects."""


def _causes(error: BaseException) -> list[BaseException]:
    """``error``, what caused it, and what failed on each rank (DCP gathers those into a CheckpointException)."""
    found: list[BaseException] = []
    todo: list[BaseException | None] = [error]
    while todo:
        current = todo.pop()
        if not isinstance(current, BaseException) or any(current is seen for seen in found):
            continue
        found.append(current)
        failures = getattr(current, "failures", None)
        todo += [current.__cause__, current.__context__]
        for failure in failures.values() if isinstance(failures, dict) else []:
            todo.append(failure[0] if isinstance(failure, tuple) else failure)  # (exception, traceback)
    return found


def _reason(error: BaseException) -> str:
    """The first line of what really failed (a rank's error rather than DCP's CheckpointException around it)."""
    causes = [e for e in _causes(error) if not isinstance(e, CheckpointException)] or [error]
    text = (str(causes[0]).strip().splitlines() or [type(causes[0]).__name__])[0].rstrip(".")
    return text if len(text) <= 300 else text[:297] + "..."


def _unsafe_error(path: Path, error: BaseException) -> UserError:
    """One line for a sharded checkpoint that did not load: refused by the pickle policy, or damaged."""
    causes = _causes(error)
    refused = next((e for e in causes if isinstance(e, UserError)), None)
    if refused is not None:
        return refused
    if any(isinstance(e, pickle.UnpicklingError) for e in causes):
        return UserError(
            f"'{path}' holds pickled objects beyond tensors and plain containers, which only arbitrary code can "
            f"load, so weights_only=True refuses them; if you trust the checkpoint, rerun with {ALLOW_PICKLE_ENV}=1"
        )
    return UserError(f"sharded checkpoint '{path}' is incomplete or corrupt and cannot be loaded ({_reason(error)})")


def _misfit_error(path: Path, error: BaseException) -> UserError:
    """One line for a sound checkpoint whose keys or shapes are not those of the model and optimizers."""
    return UserError(
        f"checkpoint '{path}' does not fit this model or its optimizer ({_reason(error)}); load it with the "
        "model and optimizer configuration that wrote it"
    )


def read_metadata(path: str | os.PathLike[str]) -> Any:
    """DCP's index of a sharded checkpoint, read safely (one line on failure)."""
    folder = Path(path)
    try:
        return SafeReader(folder).read_metadata()
    except Exception as error:
        raise _unsafe_error(folder, error) from error


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
        if key.startswith(f"{_WEIGHTS}.") and isinstance(item, TensorStorageMetadata):
            shapes[key[len(_WEIGHTS) + 1 :]] = torch.empty(item.size, dtype=item.properties.dtype, device="meta")
    return {**meta, _WEIGHTS: shapes}


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint to start from: a Lightning checkpoint file, or a sharded folder's summary (:func:`read_summary`)."""
    return read_summary(path) if is_sharded_checkpoint(path) else load_lightning_checkpoint(path)


def _by_position(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter names (DCP) keyed by position again, as ``Optimizer.state_dict``."""
    groups = optimizer_state.get("param_groups", [])
    position = {name: i for i, name in enumerate(n for group in groups for n in group["params"])}
    return {
        "state": {position[name]: value for name, value in optimizer_state.get("state", {}).items()},
        "param_groups": [{**group, "params": [position[n] for n in group["params"]]} for group in groups],
    }


def load_full_checkpoint(path: str | os.PathLike[str], weights_only: bool = False) -> dict[str, Any]:
    """A sharded checkpoint merged in this process into an ordinary Lightning checkpoint (no process group).

    Args:
        path: The checkpoint folder.
        weights_only: Merge the weights only (export, ``consolidate --weights_only``): no optimizer state.

    Raises:
        UserError: not a complete sharded checkpoint, or one that holds more than weights-only objects.
    """
    folder = Path(path)
    if not is_sharded_checkpoint(folder):
        raise UserError(
            f"'{folder}' is not a sharded checkpoint (a folder with {DCP_METADATA} and {LIGHTNING_META}, written by "
            "scenario fsdp); give the folder itself, e.g. logs/<name>/version_<n>/checkpoints/last.ckpt"
        )
    meta = safe_load(folder / LIGHTNING_META)
    read_metadata(folder)  # refused here in one line: DCP would fold the refusal into an AssertionError's text
    keys = [_WEIGHTS] if weights_only else None
    merged: dict[str, Any] = {}
    try:
        _load_state_dict(merged, storage_reader=SafeReader(folder), planner=_SafeEmptyPlanner(keys=keys), no_dist=True)
    except _LOAD_ERRORS as error:
        raise _unsafe_error(folder, error) from error
    optimizers = [merged[_OPTIMIZER.format(i)] for i in range(len(merged)) if _OPTIMIZER.format(i) in merged]
    checkpoint = {**meta, _WEIGHTS: merged.get(_WEIGHTS, {})}
    if not weights_only:
        checkpoint["optimizer_states"] = [_by_position(state) for state in optimizers]
    return checkpoint


def checkpoint_weights(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of a Lightning checkpoint: a file, or a sharded folder merged here (weights only)."""
    if is_sharded_checkpoint(path):
        return load_full_checkpoint(path, weights_only=True)[_WEIGHTS]
    return load_lightning_checkpoint(path)[_WEIGHTS]


def _key_parents(keys: Iterable[str]) -> set[str]:
    """Every dotted prefix of every key: ``a.b.c`` -> ``a``, ``a.b``."""
    parents: set[str] = set()
    for key in keys:
        end = key.find(".")
        while end != -1:
            parents.add(key[:end])
            end = key.find(".", end + 1)
    return parents


def _saved_state_only(optimizer_state: dict[str, Any], key: str, saved: Iterable[str]) -> dict[str, Any]:
    """An optimizer state dict (keyed by parameter names) without the parameters the checkpoint holds no state for.

    An optimizer has state only for the parameters it has updated: one that never got a gradient (a head that
    ``forward`` does not use, a branch not taken yet) has none in the checkpoint, and must have none after the
    load either, as in the run that wrote it. ``get_optimizer_state_dict`` of a fresh optimizer makes state up
    for every parameter (one step with zero gradients), which DCP would then look for in the checkpoint.

    Args:
        optimizer_state: ``get_optimizer_state_dict``'s ``{"state": {name: {...}}, "param_groups": [...]}``.
        key: The optimizer's key in the checkpoint (``optimizer_0``).
        saved: The checkpoint's keys (DCP's flattened ``optimizer_0.state.<name>.<field>``).
    """
    parents = _key_parents(saved)
    state = optimizer_state.get("state", {})
    kept = {name: value for name, value in state.items() if f"{key}.state.{name}" in parents}
    return {**optimizer_state, "state": kept}


def load_sharded_into(
    path: Path, module: nn.Module, optimizers: Sequence[torch.optim.Optimizer], strict: bool = True
) -> dict[str, Any]:
    """Load a sharded checkpoint into a sharded ``module`` and its ``optimizers`` (every rank: collectives).

    DCP reads each rank's part of every tensor, whatever world size wrote the checkpoint. A parameter that the
    checkpoint holds no optimizer state for (it never got a gradient) has none after the load. Returns ``meta.pt``.

    Raises:
        UserError: refused by the pickle policy, damaged, or not the checkpoint of this model and optimizers.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    saved = read_metadata(path).state_dict_metadata.keys()  # the pickle policy first, in one line
    weights = {_WEIGHTS: get_model_state_dict(module)}
    _dcp_load(path, weights)
    try:
        set_model_state_dict(module, weights[_WEIGHTS], options=StateDictOptions(strict=strict))
    except Exception as error:
        raise _misfit_error(path, error) from error
    for i, optimizer in enumerate(optimizers):
        key = _OPTIMIZER.format(i)
        state = {key: _saved_state_only(get_optimizer_state_dict(module, optimizer), key, saved)}
        _dcp_load(path, state)
        try:
            # Not strict: the parameters left without state are exactly those the checkpoint has none for.
            set_optimizer_state_dict(module, optimizer, state[key], options=StateDictOptions(strict=False))
        except Exception as error:
            raise _misfit_error(path, error) from error
    return safe_load(path / LIGHTNING_META)


def _by_name(optimizer_state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer state keyed by position (``Optimizer.state_dict``) keyed by the parameters' ``names`` instead."""
    if all(isinstance(key, str) for key in optimizer_state.get("state", {})):
        return optimizer_state  # keyed by name already
    groups = optimizer_state.get("param_groups", [])
    positions = [i for group in groups for i in group["params"]]
    if sorted(positions) != list(range(len(names))):
        raise ValueError(f"the checkpoint's optimizer has {len(positions)} parameters, this one {len(names)}")
    return {
        "state": {names[i]: value for i, value in optimizer_state.get("state", {}).items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in groups],
    }


def load_full_into(
    path: Path,
    checkpoint: dict[str, Any],
    module: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    strict: bool = True,
) -> None:
    """Load an ordinary (full) Lightning checkpoint into a sharded ``module`` and its ``optimizers`` (every rank).

    Every rank holds the whole ``checkpoint`` (read from ``path``) and keeps its shard of each tensor. Its optimizer
    states are keyed by position, as DDP, one process and ``consolidate`` write them; a parameter that one holds no
    state for (it never got a gradient) has none after the load, as in the run that wrote it.

    Raises:
        UserError: the checkpoint's weights or optimizer state are not those of this model and optimizers.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    try:
        set_model_state_dict(
            module, checkpoint[_WEIGHTS], options=StateDictOptions(full_state_dict=True, strict=strict)
        )
        for optimizer, saved in zip(optimizers, checkpoint.get("optimizer_states", [])):
            # The names in the optimizer's order, as torch's state-dict functions spell them.
            template = get_optimizer_state_dict(module, optimizer)
            names = [name for group in template["param_groups"] for name in group["params"]]
            state = _by_name(saved, names)
            # Not strict: the parameters without state are dropped below, as in the checkpoint.
            options = StateDictOptions(full_state_dict=True, strict=False)
            set_optimizer_state_dict(module, optimizer, state, options=options)
            params = [param for group in optimizer.param_groups for param in group["params"]]
            for name, param in zip(names, params):
                if name not in state["state"]:
                    # torch gave every parameter of a fresh optimizer state (a step with zero gradients).
                    optimizer.state.pop(param, None)
    except Exception as error:
        raise _misfit_error(path, error) from error


def _dcp_load(path: Path, state: dict[str, Any]) -> None:
    """DCP's load of ``state``'s keys from ``path`` (every rank), read safely; every failure is one line."""
    try:
        dcp.load(state, storage_reader=SafeReader(path), planner=SafeLoadPlanner())
    except _LOAD_ERRORS as error:
        # DCP plans the load from the index (read before, so readable) before it reads a byte: a failure there
        # is a key or a shape of this model or optimizer that the checkpoint lacks, not damage.
        planning = isinstance(error, CheckpointException) and error.args[:1] == (_PLAN_STEP,)
        refused = any(isinstance(e, (UserError, pickle.UnpicklingError)) for e in _causes(error))
        raise (_misfit_error(path, error) if planning and not refused else _unsafe_error(path, error)) from error


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2``); False where the system or file system lacks it."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    done = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    return done == 0


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def replace(source: Path, target: Path) -> None:
    """Move ``source`` (a file or folder) onto ``target`` (a file, a folder, or nothing), atomically where possible.

    ``os.replace`` cannot put a folder over a non-empty folder, nor a file over a folder; an exchange can,
    after which ``source`` holds the old target and is removed.
    """
    if not target.exists() and not target.is_symlink():
        os.rename(source, target)
    elif _exchange(source, target):
        _remove(source)
    else:  # no atomic exchange here: two renames, the old one kept under a hidden name until the new is in place
        old = target.with_name(f"{source.name}.old")
        os.rename(target, old)
        os.rename(source, target)
        _remove(old)
    _fsync_folder(target.parent)


def partial_name(target: Path, token: str) -> Path:
    """The hidden name a checkpoint is written under before it is complete (``.last.ckpt.<token>.tmp``)."""
    return target.with_name(f".{target.name}.{token}.tmp")


def save_sharded(
    checkpoint: dict[str, Any], path: Path, token: str, is_rank_zero: bool, barrier: Callable[[], None]
) -> None:
    """Write a sharded checkpoint (every rank: collectives) atomically onto ``path``.

    Args:
        checkpoint: Lightning's checkpoint dict, its ``state_dict`` and ``optimizer_states`` sharded (DTensors).
        path: The checkpoint's name (``.../last.ckpt``), the same on every rank.
        token: A name part shared by all ranks and unique to this save.
        is_rank_zero: Global rank 0 writes ``meta.pt`` and puts the folder in place.
        barrier: Wait for every rank.
    """
    partial = partial_name(path, token)
    shards = {_WEIGHTS: checkpoint[_WEIGHTS]}
    shards.update({_OPTIMIZER.format(i): state for i, state in enumerate(checkpoint.get("optimizer_states", []))})
    meta = {key: value for key, value in checkpoint.items() if key not in (_WEIGHTS, "optimizer_states")}
    # Replicated tensors (buffers) are written by rank 0, as a DDP checkpoint holds rank 0's.
    planner = DefaultSavePlanner(dedup_save_to_lowest_rank=True)
    dcp.save(shards, storage_writer=FileSystemWriter(partial, sync_files=True, overwrite=False), planner=planner)
    if is_rank_zero:  # DCP wrote .metadata after every rank's shards: the folder is complete but for meta.pt
        with open(partial / LIGHTNING_META, "wb") as handle:
            torch.save(meta, handle)
            handle.flush()
            os.fsync(handle.fileno())
        _fsync_folder(partial)
        replace(partial, path)
    barrier()


def write_file_over(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Write a checkpoint file where a sharded folder of the same name is (a sharded run resumed on one process)."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        temporary.chmod(0o644)
        replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def remove_partial(folder: Path) -> None:
    """Delete the hidden, incomplete checkpoints (files and folders) a killed save left in ``folder``."""
    for partial in folder.glob(".*.tmp"):
        _remove(partial)
