"""The layers' tests: ``tests/extras/<layer>/<lane>/``, each lane as in tests/ (tests/conftest.py marks them).

A layer's support modules (``sweep_support.py``, ``mlflow_runs.py``) sit in its folder, importable from its tests
as tests/'s own are; ``make strip`` removes the folder with the layer.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The core's distributed tests are read by some layers' tests (the launchers' helpers in test_launchers.py).
for folder in [HERE.parent / "distributed", *sorted(p for p in HERE.iterdir() if p.is_dir())]:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
