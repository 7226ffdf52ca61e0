"""Tracked runs for the tests of `tracking` (tests/cli, tests/distributed): the commands, the store read back."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Run, ViewType

from helpers import REPO

MLFLOW = str(REPO / "configs" / "tracking" / "mlflow.yaml")


def callback(class_path: str, **init_args: object) -> str:
    """``--trainer.callbacks+=`` for a test-only callback (``tests/`` is on PYTHONPATH)."""
    return "--trainer.callbacks+=" + json.dumps({"class_path": class_path, "init_args": init_args})


def default_store(cwd: Path) -> str:
    """The store a tracked run in ``cwd`` logs to when no URI is given: ``logs/mlflow.db``."""
    return f"sqlite:///{cwd / 'logs' / 'mlflow.db'}"


def all_runs(uri: str) -> list[Run]:
    """Every run of every experiment in the store, deleted ones too (a second run would show here)."""
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    return list(client.search_runs(experiments, run_view_type=ViewType.ALL)) if experiments else []


def histories(uri: str, run: Run) -> dict[str, list[tuple[int, float]]]:
    """Every metric of ``run`` as ``[(step, value), ...]`` in the order the store keeps them (by time, then step)."""
    client = MlflowClient(uri)
    found = {}
    for key in run.data.metrics:
        points = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: (m.timestamp, m.step))
        found[key] = [(m.step, m.value) for m in points]
    return found


def assert_each_step_once(history: dict[str, list[tuple[int, float]]]) -> None:
    """No metric holds one step twice, and each metric's steps only go up."""
    for key, points in history.items():
        steps = [step for step, _ in points]
        assert steps == sorted(set(steps)), f"{key}: {steps}"


def artifacts(uri: str, run_id: str, path: str | None = None) -> set[str]:
    """Every artifact file of the run, by its path in the run."""
    client = MlflowClient(uri)
    found: set[str] = set()
    for info in client.list_artifacts(run_id, path):
        found |= artifacts(uri, run_id, info.path) if info.is_dir else {info.path}
    return found
