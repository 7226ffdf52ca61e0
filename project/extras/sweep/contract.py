"""What the sweep driver and a trial process agree on: the trial's environment variable and its result file.

The driver names the study, the trial and the metric in :data:`TRIAL_ENV` (JSON); a ``fit`` that finds it installs
:class:`project.extras.sweep.pruning.SweepTrialCallback`, whose rank 0 reports each validation's value to the study and
writes :class:`TrialResult` to the file the driver named. The driver reads that file when the process has ended:
the objective (the best value of the run), whether it was pruned, and its run directory. Standard library only
(Optuna is imported by :func:`open_storage`'s callers, the driver and rank 0 of a trial).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: The environment variable that makes a ``fit`` a trial of a study.
TRIAL_ENV = "PROJECT_SWEEP_TRIAL"
#: Seconds SQLite waits for another process's write (the driver and a trial's rank 0 share the file).
SQLITE_TIMEOUT_S = 60


@dataclass(frozen=True)
class TrialSpec:
    """The study and trial a ``fit`` runs for, set by the driver in :data:`TRIAL_ENV`."""

    storage: str
    study: str
    number: int
    metric: str
    result: str
    pruner: dict[str, Any] = field(default_factory=dict)

    def to_env(self) -> str:
        """The value of :data:`TRIAL_ENV`."""
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TrialSpec | None:
        """The spec in this process's environment; ``None`` when this ``fit`` is not a trial."""
        text = (os.environ if environ is None else environ).get(TRIAL_ENV)
        return cls(**json.loads(text)) if text else None


@dataclass
class TrialResult:
    """What a trial's rank 0 recorded: the metric at each validation (by optimizer step) and the pruning verdict."""

    metric: str
    values: dict[int, float] = field(default_factory=dict)
    pruned: bool = False
    run_dir: str | None = None

    def best(self, maximize: bool) -> float | None:
        """The best finite value (the objective), ``None`` when there is none."""
        finite = [value for value in self.values.values() if math.isfinite(value)]
        if not finite:
            return None
        return max(finite) if maximize else min(finite)

    @classmethod
    def read(cls, path: str | Path) -> TrialResult | None:
        """The result at ``path``; ``None`` when the trial wrote none (it failed before its first validation)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return None
        values = {int(step): float(value) for step, value in data.get("values", {}).items()}
        return cls(data["metric"], values, bool(data.get("pruned")), data.get("run_dir"))

    def write(self, path: str | Path) -> None:
        """Write atomically: the driver never reads half a file, whenever the trial is killed."""
        path = Path(path)
        partial = path.with_name(f".{path.name}.tmp")
        partial.write_text(json.dumps(asdict(self), indent=1) + "\n")
        os.replace(partial, path)


def open_storage(url: str) -> Any:
    """Optuna's RDBStorage on ``url`` (SQLite), waiting for the other process's writes instead of failing."""
    from optuna.storages import RDBStorage

    return RDBStorage(url, engine_kwargs={"connect_args": {"timeout": SQLITE_TIMEOUT_S}})


def trial_id(storage: Any, study: str, number: int) -> int:
    """The storage's id of trial ``number`` of ``study`` (Optuna's public storage API)."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study), number)
