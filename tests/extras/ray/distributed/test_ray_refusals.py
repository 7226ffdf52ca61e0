"""The ray layer refuses, before Ray starts, what Ray's workers cannot run, and names the extra when Ray is missing."""

from __future__ import annotations

import os

import pytest

from project.errors import UserError
from project.extras.ray.job import check_ray_plan
from project.plan.environment import detect_environment
from project.plan.resolve import Hardware, ParallelConfig, resolve_plan

from helpers import CPU_DDP, DIGITS, FAST, assert_clean_error, cli_env, run_cli, run_dirs

FIT_DDP = ["fit", "--config", DIGITS, "--config", CPU_DDP, "--config", FAST, "--trainer.max_steps", "4"]


def test_a_layout_ray_cannot_run_is_refused_before_ray_starts():
    fork = resolve_plan(
        ParallelConfig(scenario="fork", devices=2, launcher="ray"), Hardware(0), detect_environment({}), 64
    )
    with pytest.raises(UserError, match=r"scenario='fork' forks the ranks from this process"):
        check_ray_plan(fork)
    ids = resolve_plan(
        ParallelConfig(scenario="ddp", devices=[1, 3], launcher="ray"), Hardware(4), detect_environment({}), 8
    )
    with pytest.raises(UserError, match=r"parallel.devices=\[1, 3\] names GPUs.*parallel.devices=2"):
        check_ray_plan(ids)


def test_without_ray_the_launcher_is_one_line_naming_the_extra(tmp_path):
    # A `ray` package that cannot be imported stands for an environment without the extra.
    shadow = tmp_path / "no_ray" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    pythonpath = os.pathsep.join([str(shadow.parent), cli_env()["PYTHONPATH"]])
    result = run_cli([*FIT_DDP, "--parallel.launcher", "ray"], tmp_path, {"PYTHONPATH": pythonpath})
    assert_clean_error(result, "parallel.launcher=ray needs Ray Train", "pip install -e .[ray]")
    assert result.returncode == 2 and run_dirs(tmp_path) == []
