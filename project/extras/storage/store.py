"""The storage layer's :class:`~project.run_store.RunStore`: a run directory given as an fsspec URL.

The core asks this process's store where a run directory in object storage differs from a local folder; each
answer here comes from the layer's modules (:mod:`.location`, :mod:`.commits`, :mod:`.pull`, :mod:`.lease`,
:mod:`.shards`). A path outside the store's scratch cache gets the local disk's answer from every method, so a run
whose ``save_dir`` is a path never reaches this class, and one that resumes from a checkpoint's URL only reads
through it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from project.extras.storage import location, pull, run, shards
from project.run_store import Held, PathLike, RunStore


class ObjectStore(RunStore):
    """A run root in object storage (``s3://bucket/prefix``, any fsspec URL) and this node's cache of it."""

    schemes = ("*",)  # every fsspec URL: its file system says whether it is installed (location.open_store)

    def configure(self, config: Any) -> None:
        """``--storage_options``: kept for every store this process opens, then redacted in ``config``."""
        options = config.get("storage_options")
        if isinstance(options, dict):
            location.configure(options)
            config.storage_options = location.redacted(options)

    def attach(self, url: str) -> Path:
        """The URL becomes this process's store; its local scratch cache is where the run writes."""
        return location.attach(url).scratch

    def pull(self, name_root: Path, version: str | None) -> None:
        """The committed checkpoints of the run name's newest (or ``version``'s) run, into the cache."""
        store = location.active()
        if store is not None:
            pull.pull(store, name_root, version)

    def reserve(self, root: Path, first: int) -> int | None:
        """The version reserved in the store (write-if-absent), not by listing one node's folders."""
        return run.reserve_version(root, first)

    def unreserve(self, run_dir: Path) -> None:
        """The store's reservation of ``run_dir`` given back."""
        run.unreserve(run_dir)

    def hold(self, run_dir: PathLike | None, training: bool) -> Held | None:
        """The run's lease (a training) and the records' last upload, instead of the ``fcntl`` lock."""
        return run.RunHold.take(run_dir, training)

    def committed(self, path: Path) -> bool:
        """In the store's cache, only a checkpoint pulled from its commit counts."""
        return pull.counts(path)

    def local_copy(self, path: str) -> str:
        """A URL's committed copy in the cache; a cached checkpoint completed from its commit."""
        if location.is_url(path):
            return pull.checkpoint_at(path)
        pull.complete(path)
        return path

    def commit(self, path: PathLike) -> None:
        """Uploaded, then committed (on the checkpoint writer's thread), then the run's records."""
        run.publish(path)

    def withdraw(self, path: PathLike) -> None:
        """Its commit withdrawn, then its data."""
        run.withdraw(path)

    def commit_sharded(
        self,
        partial: Path,
        path: Path,
        token: str,
        meta: bytes | None,
        group: Any,
        finish: Callable[[Path, Path, bytes], None],
    ) -> None:
        """Every rank uploads its own shards; rank 0 finishes the folder and commits it (:func:`.shards.publish`)."""
        shards.publish(partial, path, token, meta, group, finish)

    def drop_node_copy(self, partial: Path) -> None:
        """This node's hidden folder of a committed save, where rank 0 did not swap it onto a name here."""
        shards.drop_node_copy(partial)

    def shown(self, path: PathLike) -> str:
        """``URL (cache: path)`` in the store's cache, else the path."""
        return location.shown(path)


def add_storage_options(parser: Any) -> None:
    """``--storage_options``: fsspec's options of a URL save_dir or checkpoint, for every command."""
    parser.add_argument(
        "--storage_options",
        type=dict[str, Any] | None,
        default=None,
        help="fsspec options of a URL save_dir or checkpoint (endpoint_url, anon, client_kwargs, ...); "
        "credentials given here are used and never written into any record (docs/extras/storage.md).",
    )
