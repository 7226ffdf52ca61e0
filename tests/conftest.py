"""The test lanes: each folder of tests/ is one lane, and its tests get the lane's marker.

    tests/unit         unit         in-process and fast: no subprocess, no process group
    tests/cli          cli          one `python -m project` (or one Python) subprocess at a time, one training process
    tests/distributed  distributed  real multi-process runs on CPU over gloo (Lightning's launcher, torchrun, SLURM)
    tests/slow         slow         the real-accuracy and long runs
    tests/conformance  conformance  Lightning's features x layouts x checks (`make conformance`, docs/conformance.md)

So `pytest tests/unit` and `pytest -m unit` select the same tests, and `-m "not slow"` leaves the slow lane out.

A layer's tests (tests/extras/<layer>/<lane>/) get the marker of their lane folder too.

The slow lane (`make test-slow`, after `make test` in CI) is tests/slow, the tests marked `slow` beside the fixtures
they share, and the files of SLOW_FILES below: the long multi-process proofs, whose every test waits for several
processes' start-ups, timeouts, kills and restarts. Each keeps its own lane's marker too (`-m distributed` still
selects them). `make test`, the everyday suite, runs `-m "not slow"`.
The support modules (helpers.py, user_code.py, faults.py, ...) stay in tests/, which pyproject.toml puts on
sys.path (`pythonpath`) and helpers.cli_env on the PYTHONPATH of every CLI subprocess.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
LANES = ("unit", "cli", "distributed", "slow", "conformance")
#: Whole files of the slow lane, with what makes them long (seconds: the clean-clone `make test` of 2026-12-05 02:43,
#: before the file moved here).
SLOW_FILES = {
    # two torchrun agents lose a node and get it back, ddp and fsdp; a loss the job cannot survive (300 s, run alone)
    "extras/resilience/distributed/test_elastic.py",
    # a real one-node SLURM: an sbatch job of two tasks, a job signalled, requeued and resumed (134 s, run alone)
    "distributed/test_slurm.py",
    # a moto S3 server, two torchrun nodes without a shared disk, killed, wiped and resumed from the store (over 100 s)
    "extras/storage/distributed/test_object_storage.py",
    # sweeps whose trials are 2-process runs: a driver killed by SIGKILL, the study continued, pruning both ranks (84 s
    # for its study alone)
    "extras/sweep/distributed/test_sweep_processes.py",
    # four stalled 2-process fits and the hang drill, each waiting out its collective timeout (66 s)
    "extras/resilience/distributed/test_hang.py",
    # pipelines of 2 and 4 processes (pp 2, pp 2 x dp 2), their one-process references and resumes as other layouts
    # (about 150 s of fixture on a loaded machine; added after that run)
    "extras/sharding/distributed/test_pipeline.py",
    # Moved after the clean-clone CI of 2026-12-05 05:54 (make test 20.5 min: 14 min 11 s on the workers, 4 min 22 s
    # alone): the bad-input table's fixture runs every refusal as a command (145 s; make test-fast keeps five of them),
    # the notebooks executed headless (79 s), the quick bench (62 s), the early launcher's real starts and losses
    # (about 100 s), compile and precision runs (46 s), the sweep's and tracking's CLI runs (65 s), and the eleven
    # stop-signal runs that must run alone (about 60 s).
    "distributed/test_bad_input.py",
    "cli/test_notebooks.py",
    "cli/test_bench.py",
    "extras/early/distributed/test_early_launch.py",
    "distributed/test_precision.py",
    "extras/compile/distributed/test_compile_ddp.py",
    "extras/sweep/cli/test_sweep.py",
    "extras/tracking/cli/test_tracking.py",
    "distributed/test_stop_signals.py",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(item.fspath).resolve().relative_to(TESTS).parts
        parts = path[2:] if path[0] == "extras" else path  # a layer's tests: tests/extras/<layer>/<lane>/
        if parts[0] in LANES:
            item.add_marker(parts[0])
        if "/".join(path) in SLOW_FILES:
            item.add_marker("slow")
