"""Where a run directory given as a URL lives: the store (an fsspec file system) and its local scratch cache."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from project.errors import UserError

#: The local folder each node caches runs in (default ``.scratch`` in the working directory).
SCRATCH_ENV = "PROJECT_SCRATCH_DIR"
_DEFAULT_SCRATCH = ".scratch"
# The store this process's run uses, once a URL run directory was seen (one run per process).
_ACTIVE: Store | None = None
# The config's ``storage_options`` (fsspec's keyword arguments), for every store this process opens.
_OPTIONS: dict[str, Any] = {}
#: Words of option names whose values are credentials: used, never written into a record.
SECRET_WORDS = ("key", "secret", "token", "password", "credential", "sas", "connection_string", "session")
REDACTED = "<redacted>"


def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL (``scheme://...``), not a local path."""
    return isinstance(path, str) and "://" in path


@dataclass(frozen=True)
class Store:
    """A run root in object storage (``s3://bucket/prefix``) and the local folder that caches it on this node."""

    url: str
    scratch: Path
    fs: Any = field(compare=False, repr=False)
    #: The URL's path as the file system names it (``bucket/prefix``).
    root: str = ""

    def remote(self, local: str | os.PathLike[str]) -> str | None:
        """The store path of a file or folder of the scratch cache; ``None`` outside it."""
        try:
            relative = Path(os.path.abspath(local)).relative_to(os.path.abspath(self.scratch))
        except ValueError:
            return None
        return self.root if str(relative) == "." else f"{self.root}/{relative.as_posix()}"

    def local(self, remote: str) -> Path:
        """The scratch path of a store path under this root."""
        relative = remote[len(self.root) :].lstrip("/")
        return self.scratch / relative if relative else self.scratch

    def url_of(self, remote: str) -> str:
        """A store path as a URL, for messages."""
        return f"{urlsplit(self.url).scheme}://{remote}"


def scratch_for(url: str) -> Path:
    """The local cache folder of ``url``: ``$PROJECT_SCRATCH_DIR/<scheme>/<bucket>/<prefix>``.

    Relative by default (``.scratch/...``), as ``logs/`` is: every node resolves it in its own working directory,
    so the path rank 0 broadcasts (``trainer.log_dir``) names each node's own cache.
    """
    parts = urlsplit(url)
    return Path(os.environ.get(SCRATCH_ENV) or _DEFAULT_SCRATCH) / parts.scheme / parts.netloc / parts.path.strip("/")


def open_store(url: str) -> Store:
    """The store of ``url``; its endpoint and credentials come from the environment or ``storage_options``.

    Raises:
        UserError: the URL's scheme has no file system installed (``pip install -e .[storage]`` for s3://).
    """
    import fsspec  # a dependency of torch: always there; its S3 backend (s3fs) is the `storage` extra

    try:
        # A fresh instance: fsspec caches one per argument list, and the endpoint comes from the environment.
        fs, root = fsspec.core.url_to_fs(
            url.rstrip("/"), **{**_OPTIONS, "use_listings_cache": False, "skip_instance_cache": True}
        )
    except (ImportError, ValueError, TypeError) as error:  # TypeError: an option the file system does not take
        raise UserError(
            f"{url!r} is a URL whose store cannot be opened ({error}); install its file system (`pip install -e "
            ".[storage]` for s3://, gcsfs for gs://, adlfs for az://) and check storage_options, or give a local path"
        ) from None
    return Store(url.rstrip("/"), scratch_for(url), fs, root.rstrip("/"))


def configure(options: dict[str, Any]) -> None:
    """Open every store of this process with the config's ``storage_options`` (endpoint_url, anon, ...)."""
    global _ACTIVE
    _OPTIONS.clear()
    _OPTIONS.update(options)
    _ACTIVE = None  # a store opened before is opened again with them


def redacted(options: Any) -> Any:
    """``options`` with every credential's value (a key naming a key, secret, token, ...) replaced: for records."""
    if isinstance(options, dict):
        return {
            name: REDACTED if any(word in str(name).lower() for word in SECRET_WORDS) else redacted(value)
            for name, value in options.items()
        }
    if isinstance(options, list):
        return [redacted(value) for value in options]
    return options


def attach(url: str) -> Store:
    """Make ``url`` this process's store (the logger's ``save_dir``) and return it."""
    global _ACTIVE
    if _ACTIVE is None or _ACTIVE.url != url.rstrip("/"):
        _ACTIVE = open_store(url)
    return _ACTIVE


def active() -> Store | None:
    """This process's store, if its run directory is a URL."""
    return _ACTIVE


def detach() -> None:
    """Forget this process's store (a forked test server runs one command per child, but tests call in-process)."""
    global _ACTIVE
    _ACTIVE = None
    _OPTIONS.clear()


def shown(local: str | os.PathLike[str]) -> str:
    """How a run directory is named to the user: a store's ``URL (cache: scratch path)``, else the path itself."""
    located = of(local)
    return f"{located[0].url_of(located[1])} (cache: {os.fspath(local)})" if located is not None else os.fspath(local)


def of(local: str | os.PathLike[str] | None) -> tuple[Store, str] | None:
    """The active store and the store path of ``local``, when ``local`` is in its scratch cache."""
    store = _ACTIVE
    if store is None or local is None:
        return None
    remote = store.remote(local)
    return (store, remote) if remote is not None else None
