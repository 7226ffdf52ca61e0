"""The ``tracking`` section's rules in-process: where the store is, the step marks, parameters kept, the run's ends.

The logger tests use a real SQLite store in a temporary folder (no server, no mocks); the CLI and multi-process
runs are tests/cli/test_tracking.py and tests/distributed/test_tracking_processes.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from jsonargparse import Namespace

from project.errors import UserError
from project.extras.tracking.config import Store, TrackingConfig, resolve_store, resumed_run_id, tracking_settings
from project.extras.tracking.ledger import StepMarks, flatten, plan_params, split_params

PROJECT = Path(__file__).resolve().parents[2] / "project"


@pytest.fixture(autouse=True)
def own_environment(monkeypatch):
    """mlflow.set_tracking_uri exports the URI into os.environ: each test's export is undone after it."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


# ------------------------------------------------------------------------------------------- the section
def test_the_store_is_the_config_then_the_environment_then_sqlite_under_logs(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = resolve_store(TrackingConfig("mlflow"), "digits", tmp_path)
    assert store == Store(
        f"sqlite:///{tmp_path}/logs/mlflow.db", (tmp_path / "logs" / "mlflow-artifacts").as_uri(), "digits"
    )
    assert store.sqlite_file == tmp_path / "logs" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    assert resolve_store(TrackingConfig("mlflow"), "digits") == Store("http://tracking:5000", None, "digits")
    given = TrackingConfig("mlflow", tracking_uri="sqlite:///elsewhere/runs.db", experiment="mine")
    assert resolve_store(given, "digits") == Store(
        "sqlite:///elsewhere/runs.db", (Path("elsewhere").absolute() / "mlflow-artifacts").as_uri(), "mine"
    )


def test_the_section_is_off_unless_a_logger_is_named_and_a_checkpoint_names_its_run():
    assert tracking_settings(None) is None and tracking_settings(Namespace(logger="none", tags={})) is None
    on = TrackingConfig("mlflow", tags={"trial": "3"})
    assert tracking_settings(Namespace(logger="mlflow", tags={"trial": "3"})) == on
    assert resumed_run_id({"tracking": {"mlflow_run_id": "abc"}}) == "abc"
    assert resumed_run_id({"state_dict": {}}) is None and resumed_run_id(None) is None


# ------------------------------------------------------------------------------------------- the ledger
def test_a_metric_is_logged_once_per_step_and_never_at_or_below_the_stored_mark():
    marks = StepMarks({"train/loss": 14})
    assert marks.keep({"train/loss": 1.0, "epoch": 0.0}, 12) == {"epoch": 0.0}  # logged by the killed run
    assert marks.keep({"val/acc": 0.5, "epoch": 0.0}, 12) == {"val/acc": 0.5}  # `epoch` again at one step
    assert marks.keep({"train/loss": 0.9, "epoch": 0.0}, 15) == {"train/loss": 0.9, "epoch": 0.0}
    assert marks.keep({"val acc%": 1.0}, 16) == {"val acc%": 1.0} and marks.marks["val acc"] == 16  # MLflow's name


def test_parameters_keep_their_first_value_and_a_change_is_a_tag():
    stored = {"plan/world_size": "2", "lr": "0.1"}
    new, changed = split_params({"plan/world_size": "1", "lr": "0.1", "seed": "0"}, stored, {}, 10)
    assert new == {"seed": "0"} and changed == {"changed/plan/world_size": "1 from step 10"}
    tags = {"changed/plan/world_size": "1 from step 10"}
    assert split_params({"plan/world_size": "1"}, stored, tags, 20) == ({}, {})  # still the value in effect
    back = split_params({"plan/world_size": "2"}, stored, tags, 20)  # the first value again: said from when
    assert back == ({}, {"changed/plan/world_size": "2 from step 20"})


def test_the_plan_and_nested_hyperparameters_become_flat_parameters():
    record = {"scenario": "cpu", "world_size": 2, "strategy": {"name": "ddp"}, "notes": ["x"], "guarantees": {}}
    assert flatten({"plan": plan_params(record)}) == {
        "plan/scenario": "cpu",
        "plan/world_size": "2",
        "plan/strategy/name": "ddp",
    }


# ------------------------------------------------------------------------------- the logger on a real store
@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    from project.extras.tracking.store import check_store

    root = tmp_path_factory.mktemp("store") / "logs"
    found = Store(f"sqlite:///{root}/mlflow.db", (root / "mlflow-artifacts").as_uri(), "unit")
    check_store(found)  # creates the tables
    return found


def test_a_run_reopened_from_its_checkpoint_is_running_again_and_keeps_what_it_held(store, capsys):
    from project.extras.tracking.mlflow_logger import ProjectMLFlowLogger
    from project.extras.tracking.store import check_store, open_run

    client = check_store(store)
    first = ProjectMLFlowLogger(store, open_run(client, store, None, "unit/version_0", {"trial": "1"}), 0)
    first.log_metrics({"train/loss": 1.0, "epoch": 0.0}, 5)
    first.log_metrics({"val/acc": 0.5, "epoch": 0.0}, 5)
    first.log_hyperparams({"plan": {"world_size": 2}})
    first.outcome = "stopped"
    first.finalize("failed")
    run_id = first.run_id
    assert client.get_run(run_id).info.status == "KILLED"
    assert [m.step for m in client.get_metric_history(run_id, "epoch")] == [5]

    opened = open_run(client, store, run_id, "unit/version_0", {"trial": "1"})
    assert (opened.run_id, opened.created) == (run_id, False) and client.get_run(run_id).info.status == "RUNNING"
    assert opened.marks == {"train/loss": 5, "epoch": 5, "val/acc": 5}
    again = ProjectMLFlowLogger(store, opened, 3)
    again.log_metrics({"train/loss": 1.0}, 4)  # a step the killed run logged already
    again.log_metrics({"train/loss": 0.8}, 6)
    again.log_hyperparams({"plan": {"world_size": 1}})
    again.finalize("success")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["plan/world_size"] == "2"
    assert run.data.tags["changed/plan/world_size"] == "1 from step 3"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train/loss")] == [(5, 1.0), (6, 0.8)]

    missing = open_run(client, store, "0" * 32, "unit/version_1", {})
    assert missing.created and missing.run_id != run_id
    assert f"the checkpoint's MLflow run {'0' * 32} is not in" in capsys.readouterr().err


def test_a_run_refused_before_its_first_step_is_deleted_and_a_bad_store_is_one_line(store, tmp_path):
    from project.extras.tracking.mlflow_logger import ProjectMLFlowLogger
    from project.extras.tracking.store import check_store, open_run

    client = check_store(store)
    logger = ProjectMLFlowLogger(store, open_run(client, store, None, "unit/version_2", {}), 0)
    logger.outcome = "refused"
    logger.finalize("failed")
    logger.finalize("failed")  # Lightning may finalize again: nothing left to end
    assert client.get_run(logger.run_id).info.lifecycle_stage == "deleted"
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(UserError, match=r"MLflow cannot use the store sqlite:///.*a-file/x/mlflow.db \(\[Errno"):
        check_store(Store(f"sqlite:///{blocked}/x/mlflow.db", None, "unit"))


# ----------------------------------------------------------------------------------- mlflow stays lazy
def test_only_the_tracking_modules_import_mlflow_and_nothing_imports_them_at_the_top():
    eager = {"project/extras/tracking/store.py", "project/extras/tracking/mlflow_logger.py"}
    importing = ("project.extras.tracking.store", "project.extras.tracking.mlflow_logger")
    for path in PROJECT.rglob("*.py"):
        name = str(path.relative_to(PROJECT.parent))
        for node in ast.parse(path.read_text()).body:  # module level only: a function's import is lazy
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            modules += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for module in modules:
                if module.split(".")[0] == "mlflow" or module in importing:
                    assert name in eager, f"{name} imports {module} at start-up"
