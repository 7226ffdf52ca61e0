"""A job submitted elsewhere (``parallel.launcher`` names a launcher that did not start this process) needs a layer."""

from __future__ import annotations

import pytest

from project.errors import UserError
from project.launch import submit
from project.plan.environment import LaunchEnvironment

HERE = LaunchEnvironment(launcher="lightning", external=False)
IN_A_RAY_WORKER = LaunchEnvironment(launcher="ray", external=True)


def test_a_job_that_runs_here_is_submitted_nowhere():
    assert submit.submitter("auto", HERE) is None
    assert submit.submitter("ray", IN_A_RAY_WORKER) is None  # the launcher's own workers run the command


def test_the_first_layer_that_answers_submits_it(monkeypatch):
    def run(argv, command, plan, run_in_worker):
        """Stands for a layer's submission."""

    monkeypatch.setattr(submit, "hooks", lambda kind: [lambda launcher: None, lambda launcher: run])
    assert submit.submitter("ray", HERE) is run


def test_without_a_layer_that_submits_it_the_launcher_is_one_line(monkeypatch):
    monkeypatch.setattr(submit, "hooks", lambda kind: [])
    with pytest.raises(UserError) as info:
        submit.submitter("ray", HERE)
    assert str(info.value).startswith(
        "parallel.launcher=ray needs the ray layer (project/extras/ray), which this checkout does not have; "
        "drop parallel.launcher"
    )
