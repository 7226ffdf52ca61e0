"""Start-up: each command imports only what it needs (``python -X importtime`` lists every module imported)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import DIGITS, REPO, cli_env


def imported(*args: str) -> set[str]:
    """The modules ``python -m project ARGS`` imports, from ``-X importtime``'s report on stderr."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "project", *args],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("args", [("--help",), ("fitt",), ()])
def test_the_command_list_and_an_unknown_command_import_neither_torch_nor_lightning(args):
    modules = imported(*args)
    assert "project.commands" in modules
    assert not {"torch", "lightning", "jsonargparse"} & modules


def test_plan_imports_no_training_extras():
    modules = imported("plan", "--config", DIGITS)
    assert "project.plan_command" in modules and "lightning" in modules
    heavy = {"sklearn", "ray", "mlflow", "optuna", "tensorboard.backend.event_processing.event_accumulator"}
    assert not heavy & modules, heavy & modules
