"""Support of the sweep tests: faults by trial number (a callback for the trials) and the study read back.

The callback goes into every trial through the space file's fixed overrides
(``trainer.callbacks+: {class_path: sweep_support.TrialFaults, ...}``); it learns its trial's number from the
environment the driver sets, so a test decides which trial fails and which one learns nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import yaml

from project.extras.sweep.contract import TrialSpec

from helpers import cli_env


class TrialFaults(L.Callback):
    """Trials in ``fail`` raise as training starts; trials in ``stall`` train with a learning rate of 0.

    A stalled trial's val/acc stays at chance, below the median of the completed trials: the median pruner stops it
    at its first validation.
    """

    def __init__(self, fail: list[int] | None = None, stall: list[int] | None = None) -> None:
        self.fail = fail or []
        self.stall = stall or []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        spec = TrialSpec.from_env()
        number = spec.number if spec is not None else None
        if number in self.fail:
            raise RuntimeError(f"injected fault in trial {number}")
        if number in self.stall:
            for optimizer in trainer.optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = 0.0


def write_space(path: Path, **entries: object) -> Path:
    """A space file with ``entries`` (YAML)."""
    path.write_text(yaml.safe_dump(entries, sort_keys=False))
    return path


def sweep_command(configs: list[str], space: Path, *extra: str) -> list[str]:
    """``python -m project sweep --config ... --sweep SPACE EXTRA``."""
    bases = [word for config in configs for word in ("--config", config)]
    return [sys.executable, "-m", "project", "sweep", *bases, "--sweep", str(space), *extra]


def run_sweep(command: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run a sweep driver to its end."""
    return subprocess.run(command, cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout)


def load_trials(cwd: Path, study: str) -> list:
    """The study's trials, read back with Optuna as a user would."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{cwd / 'logs' / 'sweeps' / study / 'study.db'}"
    return optuna.load_study(study_name=study, storage=storage).trials


def processes_in(folder: Path) -> list[str]:
    """Command lines of live processes working in ``folder`` (a test's): what a sweep must not leave behind."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        if entry.name == str(os.getpid()):
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, IndexError):
            continue
        if state != "Z" and Path(cwd).is_relative_to(folder):
            found.append(" ".join(words))
    return found


def wait_until_gone(folder: Path, timeout_s: float = 10.0) -> list[str]:
    """Wait for every process working in ``folder`` to end; those still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (left := processes_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
