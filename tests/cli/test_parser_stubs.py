"""No command starts a second interpreter to learn ``sys.path`` for jsonargparse's stub resolver.

typeshed_client's default does (``python -c 'print(sys.path)'``); a rank stopped while it waited left that
child printing a BrokenPipeError traceback into the run's stderr (seen in CI on a refused 2-process fit).
"""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import CPU_DDP, DIGITS, REPO

# Runs `python -m project ARGS` and reports every subprocess and fork on stderr (audit hooks see both).
AUDITED = r"""
import os, runpy, sys
def hook(event, args):
    if event in ("subprocess.Popen", "os.fork", "os.posix_spawn"):
        sys.__stderr__.write(f"AUDIT {event} {args!r:.200}\n")
sys.addaudithook(hook)
sys.argv = ["project", *sys.argv[1:]]
runpy.run_module("project", run_name="__main__", alter_sys=True)
"""


def test_a_refused_two_process_fit_forks_its_rank_and_starts_no_interpreter(tmp_path):
    args = ["fit", "--config", DIGITS, "--config", CPU_DDP, "--parallel.backend", "mpi"]
    result = subprocess.run(
        [sys.executable, "-c", AUDITED, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    events = [line for line in result.stderr.splitlines() if line.startswith("AUDIT ")]
    assert events == ["AUDIT os.fork ()"], result.stderr[-2000:]  # rank 1 forked, nothing started
    assert "Traceback" not in result.stderr
