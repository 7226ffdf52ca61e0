"""A run directory given as a URL, held and written: what :class:`.store.ObjectStore` does at the core's calls.

Each function does nothing for a path outside the store's scratch cache, so a local folder keeps its code path:

- :func:`reserve_version`: a new run's ``version_<n>`` reserved in the store (write-if-absent), not by listing one
  node's folders; :func:`unreserve` gives it back when the run is refused before its first step;
- :class:`RunHold`: the run's lease instead of the ``fcntl`` lock; the records' last upload when the command ends;
- :func:`publish` / :func:`withdraw`: a checkpoint written (or removed) in the cache, committed to (or withdrawn
  from) the store, on the checkpoint writer's thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from project.extras.storage import commits, location, objects, records
from project.extras.storage.lease import Lease

#: The reservation of a run folder in the store.
VERSION_NAME = ".version"


def reserve_version(root: Path, first: int) -> int | None:
    """Reserve the first free ``version_<n>`` (n >= ``first``) of the run name ``root`` in its store (else ``None``)."""
    located = location.of(root)
    if located is None:
        return None
    store, remote = located
    taken = [
        int(name.removeprefix("version_"))
        for name in objects.listing(store.fs, remote)
        if name.startswith("version_") and name.removeprefix("version_").isdigit()
    ]
    version = max([first - 1, *taken]) + 1
    while objects.create(store.fs, f"{remote}/version_{version}/{VERSION_NAME}", {"reserved": True}) is None:
        version += 1
    return version


def unreserve(run_dir: Path) -> None:
    """Give back the store's reservation of a run folder (a run refused before its first step)."""
    located = location.of(run_dir)
    if located is not None:
        objects.remove(located[0].fs, f"{located[1]}/{VERSION_NAME}")


@dataclass
class RunHold:
    """A run directory in the store held for one command: its lease (``fit``, rank 0) and the records' upload."""

    store: location.Store
    run_dir: Path
    lease: Lease | None = None
    rank_zero: bool = False

    @classmethod
    def take(cls, run_dir: Path | str | None, hold: bool) -> RunHold | None:
        """For a run directory in a store's cache: the lease when ``hold``; ``None`` for a local run directory."""
        located = location.of(run_dir)
        if located is None or run_dir is None:
            return None
        from lightning.fabric.utilities.rank_zero import rank_zero_only

        store, remote = located
        held = cls(store, Path(run_dir), rank_zero=rank_zero_only.rank == 0)
        if hold:
            held.lease = Lease.take(store, Path(run_dir))
            commits.clean_uncommitted(store, f"{remote}/checkpoints")  # no other training uploads there now
        return held

    def release(self) -> None:
        """Upload the records the command wrote (rank 0), then give the lease back (idempotent)."""
        try:
            if self.rank_zero:
                records.sync(self.store, self.run_dir)
        finally:
            if self.lease is not None:
                self.lease.release()
                self.lease = None


def publish(path: Any) -> None:
    """A checkpoint just written in the cache: upload and commit it, then the run's records."""
    located = location.of(path)
    if located is not None:
        local = Path(path)
        commits.upload(located[0], local)
        records.sync(located[0], local.parent.parent)


def withdraw(path: Any) -> None:
    """A checkpoint just removed from the cache (a best replaced): withdraw its commit, then its data."""
    located = location.of(path)
    if located is not None:
        commits.withdraw(located[0], Path(path))
