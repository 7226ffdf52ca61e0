"""Where a run directory lives: a local folder (:class:`RunStore`), or a URL (``s3://...``) a layer's store serves."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from project.errors import UserError
from project.layers import hooks

#: A path: what the store methods take (Lightning hands checkpoint paths over as ``str`` or ``Path``).
PathLike = str | os.PathLike[str]


class Held(Protocol):
    """What :meth:`RunStore.hold` returns: held until released (at the end of the command)."""

    def release(self) -> None:
        """Give it back (idempotent)."""


class RunStore:
    """A run directory on the local disk: plain paths, nothing uploaded, held by the core's ``fcntl`` lock."""

    #: The URL schemes a subclass serves (``s3``); ``*`` for every URL; none for the local disk.
    schemes: tuple[str, ...] = ()

    def configure(self, config: Any) -> None:
        """Read this store's options from the parsed config (every command), replacing credentials found there."""

    def attach(self, url: str) -> Path:
        """Make ``url`` (a logger's ``save_dir``) this process's run root; the local folder the run writes into."""
        raise NotImplementedError(f"{type(self).__name__} serves no URL ({url})")

    def pull(self, name_root: Path, version: str | None) -> None:
        """Bring the run name's newest committed checkpoints (of ``version``, if given) under ``name_root``."""

    def reserve(self, root: Path, first: int) -> int | None:
        """Reserve the first free ``version_<n>`` (n >= ``first``) of the run name ``root``; ``None``: the disk does."""
        return None

    def unreserve(self, run_dir: Path) -> None:
        """Give back the reservation of a run folder (a run refused before its first step)."""

    def hold(self, run_dir: PathLike | None, training: bool) -> Held | None:
        """What holds ``run_dir`` for this command (a training's lease); ``None``: the core's ``fcntl`` lock."""
        return None

    def committed(self, path: Path) -> bool:
        """Whether the checkpoint file ``path`` may be chosen to resume (in a store: a copy of its commit)."""
        return True

    def local_copy(self, path: str) -> str:
        """The checkpoint ``path`` as this process reads it, made whole on this node (a URL: its committed copy)."""
        return path

    def commit(self, path: PathLike) -> None:
        """A checkpoint just written under ``path`` (renamed into place): on a local disk, that was its commit."""

    def withdraw(self, path: PathLike) -> None:
        """A checkpoint just removed from ``path`` (a best one replaced)."""

    def commit_sharded(
        self, partial: Path, path: Path, token: str, meta: bytes | None, group: Any, finish: Callable[..., None]
    ) -> None:
        """Each rank, once DCP saved into ``partial``: rank 0 (``meta`` given) ``finish``es it; a store, together."""
        if meta is not None:
            finish(partial, path, meta)

    def drop_node_copy(self, partial: Path) -> None:
        """Every rank, after a sharded save was committed: its node's hidden folder of it, where not needed."""

    def shown(self, path: PathLike) -> str:
        """How the run directory ``path`` is named to the user."""
        return os.fspath(path)


#: The local disk, the store of every run whose ``save_dir`` is a path.
LOCAL = RunStore()
_active: RunStore = LOCAL  # one run per process


def active() -> RunStore:
    """This process's store: the layer's that serves its run directory's URL, else the local disk."""
    return _active


def is_url(location: Any) -> bool:
    """Whether ``location`` is a URL (``scheme://...``), not a local path."""
    return isinstance(location, str) and "://" in location


@cache
def layer_stores() -> tuple[RunStore, ...]:
    """One store of each kind the installed layers serve URLs with (their ``run_stores``), in layer order."""
    return tuple(store() for store in hooks("run_stores"))


def store_for(url: str, option: str) -> RunStore:
    """The installed store that serves ``url``, given as ``option``; a ``UserError`` if none does (layer stripped)."""
    scheme, _, where = url.partition("://")
    if not where.strip("/"):  # `s3://$BUCKET/runs` with the variable unset: no bucket, a local `s3:` folder else
        raise UserError(
            f"{option} {url!r} names no bucket or location after {scheme}:// (an unset variable?); give "
            f"{scheme}://bucket/prefix, or a local path"
        )
    for store in layer_stores():
        if scheme in store.schemes or "*" in store.schemes:
            return store
    raise UserError(
        f"{option} {url} needs the storage layer (project/extras/storage), which this checkout does not have; "
        "give a local path, or restore the layer"
    )


def local_copy(path: str, option: str = "--ckpt_path") -> str:
    """The checkpoint ``path`` (given as ``option``) as this process reads it: a URL's committed copy, pulled."""
    return (store_for(path, option) if is_url(path) else _active).local_copy(path)


def open_run(config: Any) -> RunStore:
    """This process's store, chosen by the first logger's ``save_dir`` (a URL's becomes its local folder)."""
    global _active
    for store in layer_stores():
        store.configure(config)
    ckpt_path = config.get("ckpt_path")
    if is_url(ckpt_path):
        store_for(ckpt_path, "--ckpt_path")
    logger = _logger_args(config)
    url = logger.get("save_dir") if logger is not None else None
    if not is_url(url):
        _active = LOCAL
        return _active
    _active = store_for(url, "--trainer.logger.init_args.save_dir")
    logger.save_dir = os.fspath(_active.attach(url))
    if config.get("resume") == "auto" or ckpt_path == "last":
        version = logger.get("version")
        version = f"version_{version}" if isinstance(version, int) else version
        _active.pull(Path(logger.save_dir) / (logger.get("name") or ""), version)
    return _active


def _logger_args(config: Any) -> Any:
    """The ``init_args`` of the config's first logger, if any (it names the run directory)."""
    trainer = config.get("trainer")
    logger = trainer.get("logger") if trainer is not None else None
    if isinstance(logger, list):
        logger = logger[0] if logger else None
    return logger.get("init_args") if logger is not None and hasattr(logger, "get") else None
