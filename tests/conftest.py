"""The test lanes: each folder of tests/ is one lane, and its tests get the lane's marker.

    tests/unit         unit         in-process and fast: no subprocess, no process group
    tests/cli          cli          one `python -m project` (or one Python) subprocess at a time, one training process
    tests/distributed  distributed  real multi-process runs on CPU over gloo (Lightning's launcher, torchrun, SLURM)
    tests/slow         slow         the real-accuracy and long runs
    tests/conformance  conformance  Lightning's features x layouts x checks (`make conformance`, docs/conformance.md)

So `pytest tests/unit` and `pytest -m unit` select the same tests, and `-m "not slow"` leaves the slow lane out.
The support modules (helpers.py, user_code.py, faults.py, ...) stay in tests/, which pyproject.toml puts on
sys.path (`pythonpath`) and helpers.cli_env on the PYTHONPATH of every CLI subprocess.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
LANES = ("unit", "cli", "distributed", "slow", "conformance")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        lane = Path(item.fspath).resolve().relative_to(TESTS).parts[0]
        if lane in LANES:
            item.add_marker(lane)
