"""The ``tracking`` config section and what it resolves to: the store's URI, where artifacts go, the experiment.

Pure: no Lightning and no mlflow, so every command can parse the section without importing either.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

#: The top-level checkpoint key that holds the tracked run (``{"mlflow_run_id": ...}``), written on every rank.
CHECKPOINT_KEY = "tracking"
#: The run id's key inside :data:`CHECKPOINT_KEY`.
RUN_ID_KEY = "mlflow_run_id"
#: The store's file and the artifacts' folder under ``logs/`` when no URI is given.
DEFAULT_DB = "mlflow.db"
DEFAULT_ARTIFACTS = "mlflow-artifacts"
#: MLflow's own variable: a URI there wins over the default store (the config's ``tracking_uri`` wins over both).
URI_VARIABLE = "MLFLOW_TRACKING_URI"


@dataclass
class TrackingConfig:
    """The ``tracking`` config section (``configs/tracking/mlflow.yaml`` turns it on).

    Args:
        logger: none | mlflow: log this fit to MLflow as well, beside the TensorBoard logger that keeps owning
            the run directory (``logs/<name>/version_<n>``).
        tracking_uri: The MLflow store; ``None``: ``$MLFLOW_TRACKING_URI``, else a SQLite file under ``logs/`` of
            the current folder (``sqlite:///<abs>/logs/mlflow.db``, artifacts in ``logs/mlflow-artifacts``). No
            server needed.
        experiment: The MLflow experiment; ``None``: the TensorBoard logger's name (``digits``).
        tags: Tags of the run (a sweep passes ``{"study": ..., "trial": "3"}``); numbers and booleans become text.
    """

    logger: Literal["none", "mlflow"] = "none"
    tracking_uri: str | None = None
    experiment: str | None = None
    tags: dict[str, str | bool | int | float] = field(default_factory=dict)


# A URI's password (`scheme://user:password@host`) and secrets in its query (`?password=...`): never shown.
_USER_SECRET = re.compile(r"(?P<head>[A-Za-z][\w+.-]*://[^/@\s:]*):[^/\s]*@")  # the last @: a raw @ in it
_QUERY_SECRET = re.compile(r"(?i)(?P<key>[?&;](?:password|passwd|pwd|secret|token|access_token|api_key)=)[^&;\s]*")


def redact(text: str) -> str:
    """``text`` with the credentials of every URI in it hidden (``postgresql://me:***@host/db``, ``?token=***``)."""
    return _QUERY_SECRET.sub(r"\g<key>***", _USER_SECRET.sub(r"\g<head>:***@", text))


@dataclass(frozen=True)
class Store:
    """Where one tracked fit logs: the store's URI, the artifact root of a new experiment, the experiment's name.

    ``artifact_location`` is ``None`` where the store decides (a server, a database other than SQLite).
    """

    uri: str
    artifact_location: str | None
    experiment: str

    @property
    def shown(self) -> str:
        """The URI as messages show it: without its password (:func:`redact`)."""
        return redact(self.uri)

    @property
    def sqlite_file(self) -> Path | None:
        """The database file of a ``sqlite:///`` store (``None`` for any other store)."""
        prefix = "sqlite:///"
        if not self.uri.startswith(prefix):
            return None
        path = self.uri[len(prefix) :].split("?", 1)[0]
        return Path(path) if path and path != ":memory:" else None


def tracking_settings(section: Any) -> TrackingConfig | None:
    """The parsed ``tracking`` section as a :class:`TrackingConfig`; ``None`` when it is absent or off."""
    if section is None:
        return None
    values = section.as_dict() if hasattr(section, "as_dict") else dict(section)
    settings = TrackingConfig(**values)
    settings.tags = {key: str(value) for key, value in (settings.tags or {}).items()}  # MLflow's tags are text
    return settings if settings.logger != "none" else None


def resolve_store(settings: TrackingConfig, logger_name: str | None, cwd: Path | None = None) -> Store:
    """The store one fit logs to: the config's URI, else ``$MLFLOW_TRACKING_URI``, else ``logs/mlflow.db``.

    The default is under ``logs/`` of the folder the command runs in (``cwd``), where the configs' run folders are,
    whatever a run's own ``save_dir``: one store for every run and sweep trial started there.

    Args:
        settings: The ``tracking`` section.
        logger_name: The first (TensorBoard) logger's name (``digits``), the default experiment.
        cwd: The folder the default store is under (``None``: the current directory).
    """
    experiment = settings.experiment or logger_name or "Default"
    uri = settings.tracking_uri or os.environ.get(URI_VARIABLE) or None
    if uri is None:
        uri = f"sqlite:///{(cwd or Path.cwd()).absolute() / 'logs' / DEFAULT_DB}"
    store = Store(uri, None, experiment)
    database = store.sqlite_file
    if database is not None:  # beside the database file, not in ./mlruns of whichever folder the run started in
        return Store(uri, (database.absolute().parent / DEFAULT_ARTIFACTS).as_uri(), experiment)
    return store


def add_tracking_section(parser: Any) -> None:
    """The ``tracking`` section, which every command's parser takes (a run's own config.yaml holds it)."""
    parser.add_argument(
        "--tracking",
        type=TrackingConfig | None,
        default=None,
        help="Experiment tracking beside TensorBoard (fit); configs/tracking/mlflow.yaml, docs/extras/tracking.md.",
    )


def resumed_run_id(checkpoint: dict[str, Any] | None) -> str | None:
    """The MLflow run id a checkpoint was tracked in (``None``: untracked, or no checkpoint)."""
    record = (checkpoint or {}).get(CHECKPOINT_KEY)
    run_id = record.get(RUN_ID_KEY) if isinstance(record, dict) else None
    return run_id if isinstance(run_id, str) and run_id else None
