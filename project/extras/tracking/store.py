"""The MLflow store, on rank 0 only: checked before anything is written, then the run opened or reopened.

Imported only when a fit is tracked (it imports mlflow, about a second). A new SQLite store creates its tables
once (a few seconds); two fits that start at once on a new store take turns (a lock on its folder), since two
creations of the same tables collide.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking.context.registry import resolve_tags

from project.errors import UserError, first_line
from project.extras.tracking.config import Store, redact

#: The tag that names the run directory (``logs/<name>/version_<n>``, absolute) the TensorBoard logger owns.
RUN_DIR_TAG = "run_directory"
# A store checked before training answers within seconds or not at all: a server that is down is one line soon,
# not after MLflow's default of 7 retries with growing pauses (minutes). Training itself keeps MLflow's defaults.
_CHECK_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
_CHECK_HTTP_TIMEOUT = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@dataclass
class OpenedRun:
    """A run opened for this fit: its id, whether it is new, and what a reopened one holds already."""

    run_id: str
    created: bool
    marks: dict[str, int] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


@contextlib.contextmanager
def _quick_and_quiet() -> Iterator[None]:
    """Short HTTP retries and no INFO lines from the table creation, for the time of the check."""
    saved = {key: os.environ.get(key) for key in (*_CHECK_HTTP, *_CHECK_HTTP_TIMEOUT)}
    os.environ.update(_CHECK_HTTP)
    for key, value in _CHECK_HTTP_TIMEOUT.items():
        os.environ.setdefault(key, value)
    loggers = [logging.getLogger(name) for name in ("mlflow", "alembic")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _one_creator(database: Path | None) -> Iterator[None]:
    """Hold a lock on a SQLite store's folder while its tables may be created; folders made here go on failure."""
    if database is None:
        yield
        return
    folder = database.absolute().parent
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    except BaseException:
        for path in made:  # deepest first: a refused store leaves no folder behind
            with contextlib.suppress(OSError):
                path.rmdir()
        raise
    finally:
        os.close(handle)


def check_store(store: Store) -> MlflowClient:
    """A client of ``store`` that answered once (a new SQLite store gets its tables here).

    Raises:
        UserError: MLflow cannot use the URI (an unknown scheme, a folder it cannot write, a server that is down).
    """
    database = store.sqlite_file
    if database is not None and not database.exists():
        _say(f"note: creating the MLflow store {database} (its tables, once: a few seconds)")
    try:
        with _quick_and_quiet(), _one_creator(database):
            client = MlflowClient(store.uri)
            experiment = client.get_experiment_by_name(store.experiment)
    except Exception as error:  # any store: MlflowException, SQLAlchemy's errors, OSError, requests' errors
        raise UserError(
            f"tracking: MLflow cannot use the store {store.shown} ({redact(_cause(error))}); set tracking.tracking_uri "
            "(or MLFLOW_TRACKING_URI) to a store it can reach, or train without it (tracking.logger: none)"
        ) from error
    if experiment is not None and experiment.lifecycle_stage != "active":
        raise UserError(
            f"tracking: the MLflow experiment '{store.experiment}' is deleted in {store.shown}; restore it "
            f"(MLFLOW_TRACKING_URI={store.shown} mlflow experiments restore -x {experiment.experiment_id}) or name "
            "another one (tracking.experiment)"
        )
    return client


def _cause(error: Exception) -> str:
    """The gist of MLflow's error: the system's reason (``[Errno 111] Connection refused``) or the schemes it takes."""
    text = first_line(error)
    schemes = re.search(r"Supported URI schemes are: \[([^\]]*)\]", text)
    if schemes is not None:
        return "not a URI scheme MLflow knows; it takes " + ", ".join(re.findall(r"'(\w[\w-]*)'", schemes.group(1)))
    reason = re.findall(r"\[Errno -?\d+\] [^)\]]+", text)
    return reason[-1].strip().rstrip('"') if reason else text[:300]


def open_run(client: MlflowClient, store: Store, resumed: str | None, name: str, tags: dict[str, str]) -> OpenedRun:
    """The run this fit logs to: the checkpoint's run ``resumed`` set RUNNING again, else a new run ``name``.

    A checkpoint's run that the store no longer holds (deleted, or another store) is said in one line and a new
    run takes its place: the training goes on, tracked.
    """
    if resumed is not None:
        run = _active_run(client, resumed)
        if run is not None:
            client.update_run(resumed, status="RUNNING")
            client.log_batch(resumed, tags=[RunTag(k, v) for k, v in tags.items()], synchronous=True)
            marks = {key: _highest_step(client, resumed, key) for key in run.data.metrics}
            return OpenedRun(resumed, False, marks, dict(run.data.params), {**run.data.tags, **tags})
        _say(f"note: the checkpoint's MLflow run {resumed} is not in {store.shown}; this training goes on in a new run")
    run = client.create_run(_experiment_id(client, store), tags=resolve_tags(tags), run_name=name)
    return OpenedRun(run.info.run_id, True, tags=dict(run.data.tags))


def _active_run(client: MlflowClient, run_id: str) -> Run | None:
    """The run ``run_id`` unless the store has none of that id or it was deleted."""
    try:
        run = client.get_run(run_id)
    except MlflowException as error:
        if error.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    return run if run.info.lifecycle_stage == "active" else None


def _highest_step(client: MlflowClient, run_id: str, key: str) -> int:
    """The highest step of metric ``key`` in the store (read once per metric, when the run is reopened)."""
    return max((metric.step for metric in client.get_metric_history(run_id, key)), default=-1)


def _experiment_id(client: MlflowClient, store: Store) -> str:
    """The experiment's id, created with the store's artifact location if it does not exist yet."""
    experiment = client.get_experiment_by_name(store.experiment)
    if experiment is not None:  # active: check_store refused a deleted one
        return experiment.experiment_id
    try:
        return client.create_experiment(store.experiment, artifact_location=store.artifact_location)
    except MlflowException:  # another fit created it a moment ago
        experiment = client.get_experiment_by_name(store.experiment)
        if experiment is None:
            raise
        return experiment.experiment_id
