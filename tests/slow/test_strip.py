"""``make strip EXTRAS=all`` in a copy of this checkout: the core alone passes its fast tests, and a 2-process
digits fit killed mid-epoch resumes exactly with ``--resume auto`` (the core's own kill-and-resume test)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from strip_support import copy_checkout

from helpers import cli_env


@pytest.mark.timeout(1200)
def test_the_core_alone_passes_its_fast_tests_and_resumes_a_killed_two_process_fit(tmp_path):
    copy = copy_checkout(tmp_path / "template")
    stripped = subprocess.run([sys.executable, "scripts/strip.py", "all"], cwd=copy, capture_output=True, text=True)
    assert stripped.returncode == 0, stripped.stdout + stripped.stderr
    assert not [p for p in (copy / "project" / "extras").iterdir() if p.is_dir() and p.name != "__pycache__"]
    env = cli_env()
    env["PYTHONPATH"] = f"{copy / 'tests'}:{copy}"  # the copy's own code and helpers, not this checkout's
    runs = [
        ["-m", "unit or fast", "-n", "2", "tests"],  # make test-fast of the core alone
        ["tests/distributed/test_resume.py::test_sigkill_of_a_rank_then_resume_on_two_processes_matches"],
    ]
    for args in runs:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
        assert " passed" in run.stdout.splitlines()[-1] and "failed" not in run.stdout.splitlines()[-1]
