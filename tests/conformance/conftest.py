"""The conformance lane's session: verdicts collected from every xdist worker, docs/conformance.md written at the end.

The controller (or a run without xdist) makes the verdicts' folder in ``pytest_configure``, before the workers
start, and passes it in the environment they inherit (``support.RESULTS_ENV``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from conformance.report import write_report
from conformance.support import RESULTS_ENV

_START: list[float] = []


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _controller(config):
        _START.append(time.monotonic())
        os.environ[RESULTS_ENV] = tempfile.mkdtemp(prefix="conformance-")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _controller(session.config) or not _START:
        return
    folder = Path(os.environ.pop(RESULTS_ENV))
    if write_report(folder, time.monotonic() - _START[0]):
        print("\nconformance: docs/conformance.md written (every cell judged)")
    else:
        print("\nconformance: docs/conformance.md left as it is (not every cell was judged in this session)")
    shutil.rmtree(folder, ignore_errors=True)
